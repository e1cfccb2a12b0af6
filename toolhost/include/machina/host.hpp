// The host: one thread-safe request handler that applies every rule in a fixed order
// (tool lookup, lease gate, idempotency, breaker, input validation, run, output cap,
// ds_state delta) for every front.
#pragma once

#include <machina/circuit_breaker.hpp>
#include <machina/idempotency_cache.hpp>
#include <machina/lease.hpp>
#include <machina/request.hpp>
#include <machina/tool_registry.hpp>

#include <memory>
#include <string>
#include <string_view>

namespace machina {

inline constexpr std::size_t kMaxRequestBytes = 10u * 1024 * 1024;  // seed: MAX_STDIN_BYTES
inline constexpr std::size_t kMaxOutputBytes = 1024u * 1024;        // seed: _TOOLHOST_MAX_OUTPUT
inline constexpr std::string_view kBuiltinPluginFile = "machina_builtin_tools.so";

struct HostOptions {
  std::size_t max_request_bytes = kMaxRequestBytes;
  std::size_t max_output_bytes = kMaxOutputBytes;
  IdempotencyCache::Options idempotency;
  CircuitBreaker::Options breaker;
  bool lease_enforce = false;
  LeaseAuthority::Options lease;

  /// Defaults overridden by the environment: MACHINA_LEASE_ENFORCE=1 turns the lease
  /// gate on (the secret is then loaded, see load_lease_secret), MACHINA_LEASE_LEDGER
  /// names a directory that makes single use hold across processes.
  static HostOptions from_env();
};

class Host {
 public:
  /// Throws HostError if lease enforcement is on and no usable secret is configured.
  explicit Host(HostOptions options = {});

  std::vector<std::string> load_plugin(const std::string& path);
  const ToolRegistry& registry() const { return registry_; }
  const HostOptions& options() const { return options_; }

  /// Runs one decoded request. Never throws; always returns exactly one response.
  Response handle(Request& request, Session& session);

  /// Decodes one JSON request (`aid_override`: the --run aid), handles it and appends
  /// the encoded response line to `out`. Returns true if the response carries an id.
  /// `nul_terminated`: text[size] is readable and '\0', which lets decoding go faster.
  bool handle_json(std::string_view text, Session& session, std::string& out,
                   std::string_view aid_override = {}, bool nul_terminated = false);

  /// The response for a request refused by size before it was decoded.
  Response request_too_large() const;

  std::size_t idempotency_entries() const { return idempotency_.size(); }

 private:
  Response respond_json(std::string_view text, Session& session, std::string_view aid_override,
                        bool nul_terminated);
  Response handle_checked(Request& request, Session& session);
  Response execute(const Tool& tool, const Request& request, Session& session, std::int64_t now_ms);
  DsReport report(Session& session, std::shared_ptr<const SlotChanges> changes) const;

  HostOptions options_;
  ToolRegistry registry_;
  IdempotencyCache idempotency_;
  std::unique_ptr<LeaseAuthority> leases_;
};

/// Milliseconds on the monotonic clock (breaker, idempotency) and since the epoch (leases).
std::int64_t steady_now_ms() noexcept;
std::int64_t unix_now_ms() noexcept;

}  // namespace machina
