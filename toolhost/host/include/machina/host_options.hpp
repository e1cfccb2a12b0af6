// The host's options: every default, once. The option table (host_options.def) names each
// field for the command line, the Python keyword arguments and the docs.
#pragma once

#include <machina/audit.hpp>
#include <machina/circuit_breaker.hpp>
#include <machina/idempotency_cache.hpp>
#include <machina/lease.hpp>
#include <machina/process_runner_options.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>

namespace machina {

/// The largest request, and the largest tool output, a host takes by default (the dispatch
/// protocol's caps: docs/protocol.md).
inline constexpr std::size_t kMaxRequestBytes = 10u * 1024 * 1024;
inline constexpr std::size_t kMaxOutputBytes = 1024u * 1024;

/// Where native plugin tools run: on the calling thread (the inline runner, fastest), or
/// each call in a fresh process of a sandboxed worker (the process runner: a crash, exit,
/// hang or hostile tool costs one call, never the host).
enum class Isolation { inline_threads, process };

struct HostOptions {
  std::size_t max_request_bytes = kMaxRequestBytes;
  std::size_t max_output_bytes = kMaxOutputBytes;
  IdempotencyCache::Options idempotency;
  CircuitBreaker::Options breaker;
  bool lease_enforce = false;
  LeaseAuthority::Options lease;

  // Deadlines: a request's timeout_ms, else the operator's per-tool setting, else the
  // tool's own default, else default_timeout_ms; never more than max_timeout_ms.
  std::int64_t default_timeout_ms = 30'000;
  std::int64_t max_timeout_ms = 600'000;
  std::map<std::string, std::int64_t, std::less<>> tool_timeouts_ms;
  /// Inline mode: calls still running past their deadline (their threads cannot be
  /// stopped); at this many, new calls are refused with `overloaded`.
  std::size_t max_stuck_calls = 16;

  Isolation isolation = Isolation::inline_threads;
  ProcessRunnerOptions workers;  // process isolation: executable, pool size, OS limits

  // Python tools (tool manifests): warm worker interpreters per interpreter and set-up,
  // unless a tool's manifest entry says otherwise.
  std::size_t python_workers = 1;      // workers per interpreter (calls of its tools at once)
  std::uint64_t python_memory_mb = 0;  // a worker resident past this is replaced; 0: no cap
  std::string container_runtime;       // container tools' runtime unless a manifest names one ("": the first found)
  /// How often a skill of the lifecycle/* layout gets lifecycle/onTick when its manifest does
  /// not say (0: never); a skill of the skill/* runtime is ticked only when its manifest asks.
  std::int64_t skill_tick_ms = 60'000;

  /// The audit store (off unless a database or a JSON lines file is named).
  AuditOptions audit;

  /// The operator's commands a refusal's or a warning's hint names; empty: it names none.
  struct OperatorCommands {
    std::string tool_list;    // lists the tools (tool_not_found)
    std::string lease_issue;  // issues a lease; the tool's aid follows it (lease_required)
    std::string audit_store;  // names an audit store elsewhere (the default one left in the tools' reach)
  } operator_commands;

  /// Notable events (a call overran its deadline, a worker was lost), one line each,
  /// for the front to log; empty: not reported.
  std::function<void(std::string_view)> on_event;

  /// Defaults overridden by the environment: MACHINA_LEASE_ENFORCE=1 turns the lease
  /// gate on (the secret is then loaded, see load_lease_secret), MACHINA_LEASE_LEDGER
  /// names a directory that makes single use hold across processes; MACHINA_TOOLHOST_AUDIT_DB
  /// and MACHINA_TOOLHOST_AUDIT_JSONL name the audit store's files.
  static HostOptions from_env();

  /// Throws ConfigError for values no host can run with (a timeout under 1 ms, a skill tick
  /// out of range, OS limits without process isolation).
  void check() const;
  /// Whether OS limits are set while tools run in the host's own threads (the limits apply
  /// to isolated tools only): each front refuses it in the words of its options first.
  bool limits_need_isolation() const { return isolation == Isolation::inline_threads && workers.limits.any(); }
};

}  // namespace machina
