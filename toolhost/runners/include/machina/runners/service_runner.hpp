// The service runner: a tool that is an HTTP tool service (tool protocol v1 over HTTP). Each
// call POSTs the protocol's service request to the tool's URL over a kept-alive connection;
// the answer's ok/result/error map onto the host's statuses. Before its first call the
// runner asks the service's capability handshake (POST /capabilities/handshake) which of the
// tool's required guarantees it enforces; a service that does not cover them all refuses the
// call (coverage_missing) unless the operator set an explicit unsafe override, which the
// trace records. A handshake that covers them is kept for the life of the runner.
#pragma once

#include <machina/http_client.hpp>
#include <machina/runner.hpp>
#include <machina/runners/protocol_trace.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace machina {

struct ServiceToolFields {
  std::string url;                         // the run endpoint
  std::string name;                        // the protocol's tool_name
  std::string entry;                       // sent as the request's entry ("" for none)
  std::map<std::string, bool> guarantees;  // required by the tool
  bool unsafe_override = false;            // call even when the service does not cover them
  std::string token;                       // bearer token ("" for none)
  std::string app_root;                    // the request's project.app_root (the manifest's folder)
  std::size_t max_answer_bytes = 0;        // largest answer body read
  ToolSource source;
};

class ServiceRunner final : public Runner {
 public:
  /// `client` speaks to the URL's origin (shared by the tools of one service).
  ServiceRunner(std::shared_ptr<http::Client> client, ServiceToolFields fields);

  RunOutcome run(const RunSpec& spec) override;
  std::string_view kind() const override { return "service"; }

 private:
  /// What the service said of the tool's guarantees.
  struct Handshake {
    bool covered = false;     // every required guarantee is enforced
    std::string state;        // "ok", "not_covered", "failed" (for the trace)
    std::string enforcement;  // the service's word
    std::string service_version;
    std::string detail;  // why not covered
  };
  Handshake handshake(std::int64_t deadline_ms);

  std::shared_ptr<http::Client> client_;
  ServiceToolFields fields_;
  std::string target_;  // the URL's path
  std::mutex mu_;
  std::optional<Handshake> covered_;  // kept once the service covered the guarantees
};

}  // namespace machina
