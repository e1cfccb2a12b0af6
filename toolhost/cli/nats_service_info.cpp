// See nats_service_info.hpp.
#include "nats_service_info.hpp"

#include "nats_subjects.hpp"

#include <machina/random_text.hpp>

#include <cstdio>
#include <ctime>
#include <utility>

#ifndef MACHINA_VERSION
#define MACHINA_VERSION "dev"
#endif

namespace machina::cli {
namespace {

using json = nlohmann::json;

std::string random_id() {
  return random_text("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", 22);
}

std::string rfc3339_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() % 1'000'000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[64];
  std::snprintf(text, sizeof text, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<long long>(us));
  return text;
}

}  // namespace

void Endpoint::record(std::chrono::steady_clock::duration elapsed, const std::string* error) {
  std::lock_guard lock(mu);
  ++num_requests;
  processing_ns += static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count());
  if (error != nullptr) {
    ++num_errors;
    last_error = header_text(*error, 512);
  }
}

ServiceInfo::ServiceInfo(std::string prefix_, std::string queue_group_)
    : id(random_id()), started(rfc3339_now()), prefix(std::move(prefix_)), queue_group(std::move(queue_group_)) {}

json ServiceInfo::answer(std::string_view subject, const json& endpoint_data) const {
  auto identity = [&](const char* kind) {
    return json{{"type", std::string("io.nats.micro.v1.") + kind + "_response"},
                {"name", kServiceName},
                {"id", id},
                {"version", MACHINA_VERSION},
                {"metadata", {{"prefix", prefix}}}};
  };
  if (subject.starts_with("$SRV.PING")) return identity("ping");
  json eps = json::array();
  if (subject.starts_with("$SRV.INFO")) {
    json body = identity("info");
    body["description"] = "machina-toolhost: every registered tool, one endpoint each (docs/nats.md)";
    for (const auto& ep : endpoints)
      eps.push_back(
          {{"name", ep->name}, {"subject", ep->subject}, {"queue_group", queue_group}, {"metadata", ep->metadata}});
    body["endpoints"] = std::move(eps);
    return body;
  }
  json body = identity("stats");
  body["started"] = started;
  for (const auto& ep : endpoints) {
    std::lock_guard lock(ep->mu);
    eps.push_back({{"name", ep->name},
                   {"subject", ep->subject},
                   {"queue_group", queue_group},
                   {"num_requests", ep->num_requests},
                   {"num_errors", ep->num_errors},
                   {"last_error", ep->last_error},
                   {"processing_time", ep->processing_ns},
                   {"average_processing_time", ep->num_requests ? ep->processing_ns / ep->num_requests : 0},
                   {"data", endpoint_data}});
  }
  body["endpoints"] = std::move(eps);
  return body;
}

}  // namespace machina::cli
