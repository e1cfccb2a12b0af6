// See service_runner.hpp.
#include <machina/clock.hpp>
#include <machina/json_text.hpp>
#include <machina/runners/service_runner.hpp>
#include <machina/tool_protocol.hpp>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>

namespace machina {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kMaxHandshakeBytes = 64 * 1024;

/// At most 200 characters of what a service said, for an error message.
std::string body_excerpt(const std::string& body) {
  std::string text = body.substr(0, 200);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return to_valid_utf8(text) + (body.size() > 200 ? "..." : "");
}

}  // namespace

ServiceRunner::ServiceRunner(std::shared_ptr<http::Client> client, ServiceToolFields fields)
    : client_(std::move(client)), fields_(std::move(fields)) {
  http::Url url;
  std::string why;
  if (!http::Url::parse(fields_.url, url, why)) throw ConfigError(why);
  target_ = url.target;
}

ServiceRunner::Handshake ServiceRunner::handshake(std::int64_t deadline_ms) {
  Handshake h;
  nlohmann::json required = nlohmann::json::object();
  for (const auto& [name, on] : fields_.guarantees) {
    if (on) required[name] = true;
  }
  const nlohmann::json request = {{"protocol_version", tool_protocol::kVersion},
                                  {"tool_name", fields_.name},
                                  {"runner", "service"},
                                  {"required_guarantees", required}};
  http::Headers headers;
  if (!fields_.token.empty()) headers.emplace_back("Authorization", "Bearer " + fields_.token);
  const http::Reply reply =
      client_->post("/capabilities/handshake", request.dump(), headers, deadline_ms, kMaxHandshakeBytes);
  if (reply.failure != http::Reply::Failure::none || reply.status / 100 != 2) {
    h.state = "failed";
    h.detail = reply.failure != http::Reply::Failure::none
                   ? reply.detail
                   : "the handshake was answered HTTP " + std::to_string(reply.status);
    h.covered = required.empty();
    return h;
  }
  const auto answer = nlohmann::json::parse(reply.body, nullptr, false);
  if (!answer.is_object()) {
    h.state = "failed";
    h.detail = "the handshake's answer is not a JSON object";
    h.covered = required.empty();
    return h;
  }
  h.enforcement = answer.value("enforcement", std::string());
  h.service_version = answer.value("service_version", std::string());
  const auto supported = answer.value("supported_guarantees", nlohmann::json::object());
  std::string missing;
  for (const auto& [name, on] : required.items()) {
    if (!supported.is_object() || !supported.contains(name) || supported[name] != true)
      missing += (missing.empty() ? "" : ", ") + name;
  }
  const bool ok = answer.value("ok", false) == true;
  if (!required.empty() && (!ok || h.enforcement != "enforced" || !missing.empty())) {
    h.state = "not_covered";
    h.detail = !ok                           ? "the service refused the handshake"
               : h.enforcement != "enforced" ? "the service's enforcement is '" + h.enforcement + "', not 'enforced'"
                                             : "the service does not enforce " + missing;
    return h;
  }
  h.state = "ok";
  h.covered = true;
  return h;
}

RunOutcome ServiceRunner::run(const RunSpec& spec) {
  const auto t0 = Clock::now();
  const std::string trace_id = spec.trace_id.empty() ? tool_protocol::new_trace_id() : std::string(spec.trace_id);
  RunOutcome out;
  nlohmann::ordered_json trace =
      call_trace_head("service", fields_.source, fields_.name, fields_.entry, spec.timeout_ms);
  trace["service_url"] = fields_.url;
  trace["python_env"] = nullptr;  // the service's own: not known to the host
  trace["trace_id"] = trace_id;
  auto finish = [&] {
    trace["duration_ms"] = millis_since(t0);
    spec.call.trace_json = trace.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    return out;
  };
  auto fail = [&](ErrorKind kind, std::string detail) {
    out.ending = RunOutcome::Ending::failed;
    out.failure = kind;
    out.detail = std::move(detail);
    return finish();
  };

  bool required = false;
  for (const auto& [name, on] : fields_.guarantees) required = required || on;
  Handshake h;
  if (!required) {
    h.state = "not_required";  // nothing to be covered: the service is not asked
    h.covered = true;
  } else {
    {
      std::lock_guard lock(mu_);
      if (covered_) h = *covered_;
    }
    if (h.state.empty()) {
      h = handshake(spec.deadline_ms);
      std::lock_guard lock(mu_);
      // Kept when it lets calls through; a refusal is asked again (the service may change).
      if (h.covered || fields_.unsafe_override) covered_ = h;
    }
  }
  trace["service_handshake"] = h.state;
  trace["enforcement_level"] = !required ? "none" : h.covered ? "enforced" : "not_enforceable";
  if (!h.enforcement.empty()) trace["service_enforcement"] = h.enforcement;
  if (!h.service_version.empty()) trace["service_version"] = h.service_version;
  if (!h.covered) {
    if (!fields_.unsafe_override) {
      trace["reason_code"] = "coverage_missing";
      return fail(ErrorKind::coverage_missing, "coverage_missing: " + fields_.url + ": " + h.detail);
    }
    trace["unsafe_override"] = true;  // the operator's explicit choice, on record
  }

  std::string body;
  body.reserve(spec.input_json.size() + 256);
  tool_protocol::encode_service_call({fields_.name, fields_.entry, spec.input_json, false, trace_id, {}},
                                     spec.timeout_ms, fields_.app_root, body);
  http::Headers headers;
  if (!fields_.token.empty()) headers.emplace_back("Authorization", "Bearer " + fields_.token);
  const http::Reply reply = client_->post(target_, body, headers, spec.deadline_ms, fields_.max_answer_bytes);
  switch (reply.failure) {
    case http::Reply::Failure::none: break;
    case http::Reply::Failure::unreachable:
      return fail(ErrorKind::service_unavailable, "service unavailable: " + reply.detail);
    case http::Reply::Failure::timed_out:
      out.ending = RunOutcome::Ending::timed_out;
      out.detail = reply.detail;
      return finish();
    case http::Reply::Failure::too_large:
      return fail(ErrorKind::output_too_large, "service answer too large: " + reply.detail);
    case http::Reply::Failure::bad_reply:
      return fail(ErrorKind::service_bad_response, "bad service answer: " + reply.detail);
  }
  trace["http_status"] = reply.status;
  if (reply.status / 100 != 2) {
    return fail(ErrorKind::service_http_error, "service answered HTTP " + std::to_string(reply.status) + " (" +
                                                   fields_.url + ")" +
                                                   (reply.body.empty() ? "" : ": " + body_excerpt(reply.body)));
  }
  tool_protocol::Answer answer;
  std::string why;
  if (!tool_protocol::decode_answer(reply.body, answer, why)) {
    return fail(ErrorKind::service_bad_response,
                "bad service answer: " + why + (reply.body.empty() ? "" : " (" + body_excerpt(reply.body) + ")"));
  }
  out.ending = RunOutcome::Ending::ran;
  out.rc = tool_protocol::apply_answer(answer, spec.call);
  write_answer_error(answer, trace);
  return finish();
}

}  // namespace machina
