// The host: one thread-safe request handler that applies every rule in a fixed order
// (tool lookup, lease gate, idempotency, breaker, input validation, run, output cap,
// ds_state delta) for every front.
#pragma once

#include <machina/audit.hpp>
#include <machina/circuit_breaker.hpp>
#include <machina/clock.hpp>
#include <machina/host_options.hpp>
#include <machina/idempotency_cache.hpp>
#include <machina/lease.hpp>
#include <machina/request.hpp>
#include <machina/runner.hpp>
#include <machina/tool_registry.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace machina {

/// How a front answers on time when a tool overruns its deadline on the front's own
/// thread (inline mode): see Host::handle.
class OverrunSink {
 public:
  virtual ~OverrunSink() = default;
  /// Called once, on the host's watchdog thread, with the `timeout` response to deliver
  /// now. The thread that called handle() stays inside the tool until the tool returns;
  /// its handle() then returns a response marked `overran`, which the front drops.
  virtual void deliver(Response response) = 0;
};

/// The pipeline's counters.
struct HostStats {
  std::uint64_t calls = 0;     // tool runs started
  std::uint64_t timeouts = 0;  // calls answered `timeout`
  std::uint64_t crashes = 0;   // calls answered `tool_crashed`
};

/// The rule pipeline. It runs every tool through the tool's Runner and knows no concrete
/// runner: the tool host (tool_host.hpp) builds the runners, registers the tools and fills
/// the hooks through which the fronts reach what it owns.
class Host {
 public:
  /// What the fronts reach through the host that its owner provides; each may be empty.
  struct Hooks {
    /// A connection of a front's opened or closed (a --serve stream, an MCP or skill
    /// connection, a Python transport): the hosted skills are told.
    std::function<void(const std::string& id)> connection_opened;
    std::function<void(const std::string& id)> connection_closed;
  };

  /// Throws ConfigError for options no host can run with (HostOptions::check), if lease
  /// enforcement is on and no usable secret is configured, or if an audit store named on
  /// purpose cannot be opened.
  explicit Host(HostOptions options = {}, Hooks hooks = {});
  ~Host();
  Host(const Host&) = delete;
  Host& operator=(const Host&) = delete;

  void connection_opened(const std::string& id) {
    if (hooks_.connection_opened) hooks_.connection_opened(id);
  }
  void connection_closed(const std::string& id) {
    if (hooks_.connection_closed) hooks_.connection_closed(id);
  }
  const ToolRegistry& registry() const { return registry_; }
  /// The registry to register tools in (the tool host's, while it loads them).
  ToolRegistry& registry_to_fill() { return registry_; }
  const HostOptions& options() const { return options_; }

  /// Runs one request, applying every rule (see docs/protocol.md, the order of rules: the request's size, its
  /// `aid` and `timeout_ms`, then lookup, lease gate, idempotency, breaker, input
  /// validation, the run with its deadline, output cap, ds_state). Never throws; always
  /// returns exactly one response.
  ///
  /// Every call has a deadline. In process isolation the worker is killed at the deadline
  /// and the call answers `timeout` on time. Inline, the tool runs on this thread, which
  /// nothing can safely stop: with an overrun sink, the host hands the `timeout` response to
  /// it at the deadline (and later returns an `overran` response here); without one,
  /// the `timeout` response is returned here once the tool gives the thread back.
  Response handle(Request& request, CallerState& session, OverrunSink* overrun_sink = nullptr);

  /// The response for a request refused by size before it was decoded.
  Response request_too_large() const;

  /// Keeps the answers of calls with an idempotency key in `store` (one shared by a group of
  /// hosts) rather than in this host's own cache; null: the host's own cache again. The same
  /// rules hold either way (see run_keyed). Call it before the first call is handled.
  void set_idempotency_store(std::shared_ptr<IdempotencyStore> store) { shared_store_ = std::move(store); }

  /// Entries of the host's own cache.
  std::size_t idempotency_entries() const { return idempotency_.size(); }
  HostStats stats() const;

  /// The audit store (null unless HostOptions::audit names one).
  AuditLog* audit() const { return audit_.get(); }
  /// Why an optional audit database (AuditOptions::optional) could not be opened, for the
  /// front to tell its user; "" when it opened or none was asked for.
  const std::string& audit_unavailable() const { return audit_unavailable_; }
  /// Records nothing from here on (the tool host's choice, before the first call, for a
  /// default store the tools could reach).
  void drop_audit() { audit_.reset(); }
  /// Writes out what the audit store has been given (before a quick exit).
  void flush_audit() const {
    if (audit_) audit_->flush();
  }

  /// Counts the inline calls still running past their deadline in `counter` (the inline
  /// runner's, which its owner builds after the host); null: none. Call it before the first
  /// call is handled.
  void set_stuck_counter(const std::atomic<std::uint64_t>* counter) { stuck_counter_ = counter; }
  /// Inline calls still running past their deadline (one load: the fronts ask after every
  /// answer).
  std::uint64_t stuck_calls() const {
    return stuck_counter_ != nullptr ? stuck_counter_->load(std::memory_order_relaxed) : 0;
  }

  /// Hands `line` to HostOptions::on_event, if set.
  void event(const std::string& line) const;

  /// The deadline a request for `tool` gets, in milliseconds.
  std::int64_t timeout_for(const Tool& tool, const Request& request) const;

 private:
  /// The refusal of a call to an aid no tool has: the nearest aid as its hint.
  Response tool_not_found(std::string_view aid) const;
  struct InFlight;

  Response handle_checked(Request& request, CallerState& session, OverrunSink* overrun_sink, std::int64_t started_ns);
  AuditCall audit_call(const Request& request, const Response& response, std::int64_t started_ns) const;
  void record_call(const Request& request, const Response& response, std::int64_t started_ns) const;
  /// Records the call; one the store must record (AuditOptions::required) is first written,
  /// and if that fails `r` becomes audit_unavailable (its output withheld).
  void record_or_withhold(const Request& request, CallerState& session, Response& r, std::int64_t started_ns) const;
  /// Runs the call into `r` (a fresh Response, the caller's return object).
  void execute(const Tool& tool, const Request& request, CallerState& session, std::int64_t now_ms, InFlight& in_flight,
               Response& r);
  /// A call with an idempotency key: `store` first, then execute(). The store is the host's
  /// own cache, called as itself (no indirect call on a fresh key's path), or a shared store
  /// through the interface; the rule is this one function either way.
  template <class Store>
  void run_keyed(Store& store, const Tool& tool, const Request& request, CallerState& session, std::int64_t now_ms,
                 InFlight& in_flight, Response& r);
  /// run_keyed's answer for a key already known (a hit, a wait, a conflict), a full cache, or
  /// one the store gives: false once `r` is the answer; true when the call is to run after
  /// all (a `wait` ended with the key free: `ticket` is then this call's `run`).
  [[gnu::noinline]] bool answer_without_running(IdempotencyStore& store, const Tool& tool, CallerState& session,
                                                IdempotencyStore::Ticket& ticket, Response& r);
  DsReport report(CallerState& session, std::shared_ptr<const SlotChanges> changes) const;
  Response timeout_response(const Tool& tool, std::int64_t timeout_ms, const std::string& detail = {}) const;

  HostOptions options_;
  Hooks hooks_;
  const std::atomic<std::uint64_t>* stuck_counter_ = nullptr;  // see set_stuck_counter
  std::unique_ptr<AuditLog> audit_;
  std::string audit_unavailable_;
  IdempotencyCache idempotency_;
  std::shared_ptr<IdempotencyStore> shared_store_;  // set: used in place of idempotency_
  std::unique_ptr<LeaseAuthority> leases_;
  std::atomic<std::uint64_t> calls_{0}, timeouts_{0}, crashes_{0};
  ToolRegistry registry_;
};

}  // namespace machina
