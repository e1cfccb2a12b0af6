// HostOptions: the environment's defaults and the checks every host makes of its options.
#include <machina/errors.hpp>
#include <machina/host_options.hpp>

#include <cstdlib>
#include <cstring>

#include <unistd.h>

namespace machina {

HostOptions HostOptions::from_env() {
  HostOptions o;
  if (const char* v = std::getenv("MACHINA_LEASE_ENFORCE")) o.lease_enforce = std::strcmp(v, "1") == 0;
  if (const char* v = std::getenv("MACHINA_LEASE_LEDGER"); v != nullptr && *v != '\0') {
    o.lease.ledger_dir = v;
  } else {
    // Every process of one user shares a ledger by default, so a lease used by one
    // --run or one serve process of a pool cannot be replayed against another.
    const char* runtime = std::getenv("XDG_RUNTIME_DIR");
    o.lease.ledger_dir = (runtime != nullptr && *runtime != '\0')
                             ? std::string(runtime) + "/machina-toolhost/leases"
                             : "/tmp/machina-toolhost-" + std::to_string(getuid()) + "/leases";
  }
  if (const char* v = std::getenv("MACHINA_TOOLHOST_AUDIT_DB"); v != nullptr && *v != '\0') o.audit.db_path = v;
  if (const char* v = std::getenv("MACHINA_TOOLHOST_AUDIT_JSONL"); v != nullptr && *v != '\0') o.audit.jsonl_path = v;
  if (const char* v = std::getenv("MACHINA_TOOLHOST_CONTAINER_RUNTIME"); v != nullptr && *v != '\0')
    o.container_runtime = v;
  return o;
}

void HostOptions::check() const {
  if (default_timeout_ms < 1 || max_timeout_ms < 1) throw ConfigError("timeouts must be at least 1 ms");
  for (const auto& [aid, ms] : tool_timeouts_ms) {
    if (ms < 1) throw ConfigError("the timeout for " + aid + " must be at least 1 ms");
  }
  if (!container_runtime.empty() && container_runtime != "podman" && container_runtime != "docker") {
    throw ConfigError("the container runtime must be podman or docker, not '" + container_runtime + "'");
  }
  if (skill_tick_ms < 0 || skill_tick_ms > 86'400'000) {
    throw ConfigError("the skills' tick interval must be from 0 (never) to 86400000 ms");
  }
  if (limits_need_isolation()) throw ConfigError("OS limits apply to isolated tools: isolate them in processes");
}

}  // namespace machina
