// How a tool runs: a runner executes one call of one tool and reports what happened (the
// tool's own result code with its output or error, or a crash, a timeout, a refusal).
// Every tool is registered with the runner it needs; the host applies its rules around
// whichever runner it is (see host.hpp). The runners are in toolhost/runners: inline,
// isolated processes, Python tools, skills and MCP servers, HTTP services.
#pragma once

#include <machina/call_context.hpp>
#include <machina/errors.hpp>
#include <machina/request.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace machina {

struct Tool;

/// The host's side of a call whose deadline passes while its tool still holds the
/// calling thread (inline runners): called once, on a runner's own thread, to answer the
/// call `timeout` now. The run then returns `overran` when the tool finally gives back.
class Overrun {
 public:
  virtual ~Overrun() = default;
  virtual void overrun() noexcept = 0;
};

/// One call, as the host hands it to a runner. The input is valid JSON and matched the
/// tool's schema.
struct RunSpec {
  const Tool& tool;
  std::string_view input_json;       // NUL-terminated (input_json.data()[size] == '\0')
  std::int64_t deadline_ms;          // on the steady clock (steady_now_ms)
  std::int64_t timeout_ms;           // the deadline's length (for messages)
  CallContext& call;                 // output, error and ds_state reads and writes
  Overrun* overrun;                  // never null
  std::string_view trace_id = {};    // the caller's, if the request carried one
  CancelToken* cancel = nullptr;     // the caller may stop the call (null: it cannot)
  ProgressSink* progress = nullptr;  // where to report progress (null: nobody asked)
  std::string_view user = {};        // who calls (the request's `user`; a policy's scope)
};

struct RunOutcome {
  enum class Ending {
    ran,         // the tool ran: `rc` (machina_tool_result) and the CallContext say how
    timed_out,   // killed at the deadline (`detail` may say more)
    crashed,     // its process died or broke the protocol (`detail` says how)
    overloaded,  // refused before running (`detail` says why)
    closed,      // the runner has been closed
    overran,     // returned after Overrun::overrun() answered the call
    failed,      // the runner answers the call with `failure` and `detail` (a guarantee it
                 // cannot enforce, a service it cannot reach ...)
    cancelled    // stopped at its caller's request (the front may answer nothing)
  };
  Ending ending = Ending::ran;
  int rc = 0;
  std::string detail;
  ErrorKind failure = ErrorKind::internal_error;  // with Ending::failed
};

class Runner {
 public:
  virtual ~Runner() = default;
  /// Runs one call. Thread-safe; never throws for anything a tool does.
  virtual RunOutcome run(const RunSpec& spec) = 0;
  /// Releases what the runner holds (processes); later calls end `closed`.
  virtual void close() {}
  /// "inline", "process", ... (for tool listings and messages).
  virtual std::string_view kind() const = 0;
  /// The capability guarantees (tool protocol v1 names) the operating system enforces for
  /// this runner's calls: what the host's HTTP service answers a capability handshake with.
  virtual std::vector<std::string> enforced_guarantees() const { return {}; }
};

/// Where runners report notable events (a call overran its deadline, a worker was lost),
/// one line each; empty: not reported.
using EventSink = std::function<void(std::string_view)>;

}  // namespace machina
