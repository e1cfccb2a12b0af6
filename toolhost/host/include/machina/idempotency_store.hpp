// Where the results of calls with an idempotency key are kept: the host's own cache
// (IdempotencyCache) or a store shared by a group of hosts (the NATS front's key-value
// bucket). The host applies one rule over either (Host::run_keyed): a key's first call runs,
// a duplicate gets its answer, a key used with another input is a conflict, and which
// answers are kept is keeps() below.
#pragma once

#include <machina/errors.hpp>
#include <machina/request.hpp>

#include <cstdint>
#include <string_view>

namespace machina {

/// One call with an idempotency key, as a store sees it.
struct KeyedCall {
  std::string_view aid;         // the tool (its registered aid)
  std::string_view key;         // the idempotency key
  std::string_view input_json;  // what the key is bound to
  std::int64_t now_ms = 0;      // the steady clock when the host took the call
  std::int64_t timeout_ms = 0;  // the call's deadline, from now_ms
};

class IdempotencyStore {
 public:
  enum class Outcome {
    run,       // first with this key: run the tool, then complete()
    hit,       // a kept answer for the same input: the answer is given
    wait,      // the same call is running: wait()
    conflict,  // the key was used with another input
    full,      // no room for another call still running: refuse the call (overloaded)
    answered   // the store answers the call itself (not a kept answer; the tool is not run)
  };
  struct Ticket {
    Outcome outcome = Outcome::run;
    std::uint32_t slot = 0;  // run, wait: the store's own reference
  };

  /// The keep rule: an answer the tool gave (a result or its own error) is kept and given to
  /// every later call with the key; any other (refused, timed out, crashed, cancelled…) is
  /// dropped, so that a retry may run the tool again.
  static bool keeps(const Response& r) noexcept { return r.ok() || r.kind == ErrorKind::tool_error; }

  virtual ~IdempotencyStore() = default;

  /// The call's ticket. On `hit` and `answered`, `answer` holds the answer (the host's fresh
  /// return object; left as it was on the other outcomes).
  virtual Ticket begin(const KeyedCall& call, Response& answer) = 0;
  /// For a `wait` ticket: once the call waited for has ended, `hit` or `answered` (with
  /// `answer` set), or `run` (the key is free again and this call holds it now: run, then
  /// complete()), or `conflict`.
  virtual Ticket wait(const Ticket& ticket, Response& answer) = 0;
  /// For a `run` ticket: the call's answer, kept for later calls if `keep` (keeps()).
  /// Never throws: a key is never left held by a call that has ended.
  virtual void complete(const Ticket& ticket, const Response& response, bool keep, std::int64_t now_ms) noexcept = 0;
};

}  // namespace machina
