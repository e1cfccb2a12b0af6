// The front-independent request and response: every front decodes its wire format
// into a Request and encodes the Response the host gives back.
#pragma once

#include <machina/ds_state.hpp>
#include <machina/errors.hpp>

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace machina {

/// Largest `timeout_ms` a request may carry (the host's ceiling may be lower).
inline constexpr std::uint64_t kMaxRequestTimeoutMs = 2'147'483'647;
inline constexpr const char* kTimeoutRuleText =
    "field 'timeout_ms' must be a whole number of milliseconds from 1 to 2147483647";
/// Longest `trace_id` a request may carry (it is echoed in the response's trace).
inline constexpr std::size_t kMaxTraceIdBytes = 256;
/// Longest `user` a request may carry.
inline constexpr std::size_t kMaxUserBytes = 256;

/// A caller's wish to stop a call it made (MCP's notifications/cancelled). The front
/// cancels; the runner of the call says how it stops it (a worker killed, a child told),
/// or nothing for a call that cannot be stopped (an inline tool runs to its end).
class CancelToken {
 public:
  /// Cancels, and runs the runner's callback (once) on this thread.
  void cancel() {
    std::function<void()> fn;
    {
      std::lock_guard lock(mu_);
      if (cancelled_) return;
      cancelled_ = true;
      fn = std::move(fn_);
    }
    if (fn) fn();
  }
  bool cancelled() const {
    std::lock_guard lock(mu_);
    return cancelled_;
  }
  /// The runner's way to stop the call, run at once if already cancelled. `nullptr` when
  /// the call has ended.
  void on_cancel(std::function<void()> fn) {
    {
      std::lock_guard lock(mu_);
      if (!cancelled_) {
        fn_ = std::move(fn);
        return;
      }
    }
    if (fn) fn();
  }

 private:
  mutable std::mutex mu_;
  bool cancelled_ = false;
  std::function<void()> fn_;
};

/// Where a runner reports a call's progress (MCP's notifications/progress), if the front
/// asked for it.
class ProgressSink {
 public:
  virtual ~ProgressSink() = default;
  /// `total` < 0: unknown.
  virtual void progress(double done, double total, std::string_view message) = 0;
};

/// The front a request came through, as the front labels it: its name (the audit store
/// records it with each call; "" is recorded as "unknown") and whether the caller is the OS
/// user this process runs as (a local stream, not a network peer).
struct FrontLabel {
  std::string_view name;
  bool local_caller = false;
};

/// A request as every front hands it to Host::handle, which applies every rule to it
/// (sizes, `aid`, `timeout_ms`): a front only translates its wire format.
struct Request {
  std::string aid;
  std::string input_json = "{}";
  std::optional<DsUpdate> ds_state;
  std::optional<std::string> idempotency_key;
  std::optional<std::string> lease_token;
  std::string id_json;                     // the request's `id` as JSON text, echoed verbatim; empty: none
  std::optional<std::int64_t> timeout_ms;  // the caller's deadline for this call
  std::optional<std::string> trace_id;     // the caller's correlation id, echoed in a trace
  std::optional<std::string> user;         // who calls: selects the tool packs' policy scope
  std::string_view caller;                 // without `user`: who calls as the front knows it, for the audit store only
  FrontLabel front;                        // set by the front that decoded it
  // Set by a front whose own parse showed that validate_json accepts input_json (the
  // host then does not check it again); never set for text it did not parse itself.
  bool input_json_valid = false;
  // The front's, for the time of the call (null: none).
  CancelToken* cancel = nullptr;
  ProgressSink* progress = nullptr;
};

struct Response {
  ErrorKind kind = ErrorKind::none;
  std::string error;        // human-readable; empty when ok
  std::string output_json;  // the tool's output when ok
  bool idempotent_hit = false;
  DsReport ds_state;
  // lease_required / lease_rejected details (docs/protocol.md, lease errors)
  int lease_tier = -1;
  std::string lease_aid;
  std::string lease_reason;
  // What the caller can do about the failure (the nearest aid to an unknown one, how to get a
  // lease); empty: nothing to add. Encoded as the response's `hint`, beside the error it explains.
  std::string hint;
  std::string id_json;  // echoed request id
  // What the runner reports of the call (runner kind, timings, enforcement...), as a JSON
  // object's text; empty: none (native plugin tools). Encoded as the response's `trace`.
  std::string trace_json;
  // Set on the late return of a call whose timeout was already delivered through the
  // front's OverrunSink (see Host::handle): the front must drop this response.
  bool overran = false;

  bool ok() const { return kind == ErrorKind::none; }
  Status status() const { return error_info(kind).status; }

  static Response failure(ErrorKind kind, std::string message) {
    Response r;
    r.kind = kind;
    r.error = std::move(message);
    return r;
  }
};

}  // namespace machina
