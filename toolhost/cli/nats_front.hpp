// The NATS front (`machina-toolhost --nats URL`): the host as a NATS micro service, on the
// NATS C client. Subjects: PREFIX.call (the request envelope or an OpenAI tool call),
// PREFIX.tools (the tool list), PREFIX.tool.<aid> per tool, the `tools.*` subjects of the
// tools registered under such names (a body of the tool's own input is answered
// {data, error}; an unknown `tools.*` subject is answered InvalidInput), and the discovery
// subjects $SRV.PING|INFO|STATS[.machina-toolhost[.<id>]] in the shapes of the micro-service
// API; with --nats-durable also the calls of a JetStream work queue (nats_durable.hpp).
// Every call goes through Host::handle, with the host's deadlines and its overrun sink of a
// call stuck past its deadline; idempotency keys in the host's own cache or, shared by a
// group of hosts, in a JetStream key-value bucket (nats_kv_store.hpp). docs/nats.md.
#pragma once

#include "stop_signal.hpp"

#include <machina/host.hpp>

#include <cstdint>
#include <string>

namespace machina::cli {

struct NatsFrontOptions {
  std::string url = "nats://127.0.0.1:4222";
  std::string prefix = "machina";
  std::string queue_group = "q";  // the hosts of one group share the calls
  unsigned workers = 32;          // calls running at once
  int max_pending = 4096;         // messages waiting per subscription (the client drops beyond)
  // Idempotency keys: the host's own cache, or with `shared_store` a JetStream key-value
  // bucket shared by the group (nats_kv_store.hpp).
  bool shared_store = false;
  std::string kv_bucket = "machina_idempotency";
  std::string kv_key;                  // the group's key (load_kv_key)
  std::int64_t kv_ttl_s = 600;         // how long an entry lasts
  std::int64_t claim_grace_ms = 5000;  // a claim outlives its call's deadline by this much
  // Durable mode (nats_durable.hpp): also calls from a JetStream work-queue stream.
  bool durable = false;
  std::string stream = "MACHINA_CALLS";
  std::string consumer = "machina-hosts";  // the durable pull consumer the hosts share
  double ack_wait_s = 30.0;                // a message unacknowledged and not in progress this long is delivered again
  int max_deliver = 5;                     // deliveries of one message at most
};

/// Throws ConfigError for a prefix, queue group, stream or consumer name that cannot be used.
void check_nats_front_options(const NatsFrontOptions& options);

/// Serves until `control` says stop (by default SIGINT or SIGTERM), then stops taking calls,
/// answers those taken and returns the exit code. Throws ConfigError if it cannot connect.
int serve_nats(Host& host, const NatsFrontOptions& options, const FrontControl& control = {});

}  // namespace machina::cli
