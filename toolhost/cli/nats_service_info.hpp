// The NATS front as a micro service others can discover: who it is (a random id, when it
// started), its endpoints with their statistics, and its answers to $SRV.PING, $SRV.INFO and
// $SRV.STATS in the shapes of the micro-service API. docs/nats.md, "Discovery and stats".
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace machina::cli {

inline constexpr char kServiceName[] = "machina-toolhost";

/// One served subject and its statistics.
struct Endpoint {
  std::string name, subject, aid;  // aid "": the request names the tool
  nlohmann::json metadata = nlohmann::json::object();
  bool lists_tools = false;
  std::mutex mu;
  std::uint64_t num_requests = 0, num_errors = 0, processing_ns = 0;
  std::string last_error;

  /// One answered request that took `elapsed`; `error`: its failure's message.
  void record(std::chrono::steady_clock::duration elapsed, const std::string* error);
};

/// This service: what discovery answers.
struct ServiceInfo {
  std::string id;       // 22 random letters and digits
  std::string started;  // RFC 3339, UTC
  std::string prefix, queue_group;
  std::vector<std::unique_ptr<Endpoint>> endpoints;

  /// A service of a new id, started now.
  ServiceInfo(std::string prefix, std::string queue_group);

  /// The answer on a `$SRV.PING|INFO|STATS…` subject; `endpoint_data` is each endpoint's
  /// `data` in STATS.
  nlohmann::json answer(std::string_view subject, const nlohmann::json& endpoint_data) const;
};

}  // namespace machina::cli
