// See http_tool_protocol.hpp.
#include "http_tool_protocol.hpp"

#include <machina/errors.hpp>
#include <machina/json_text.hpp>
#include <machina/runner.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <vector>

#ifndef MACHINA_VERSION
#define MACHINA_VERSION "dev"
#endif

namespace machina::cli {
namespace {

/// The tool `name` stands for (ToolRegistry::resolve); none: `why` says so when several
/// tools share the name, else stays empty.
const Tool* find_tool(const ToolRegistry& tools, const std::string& name, std::string& why) {
  std::vector<std::string> sharing;
  const Tool* tool = tools.resolve(name, &sharing);
  if (tool == nullptr && sharing.size() > 1) {
    std::string aids;
    for (const auto& aid : sharing) aids += (aids.empty() ? "" : ", ") + aid;
    why = "the name '" + excerpt(name) + "' is shared by " + aids + ": name the tool by its aid";
  }
  return tool;
}

/// A request body as a JSON value, or why not. Checked first by validate_json, whose
/// nesting limit keeps what is built here shallow enough to dump (nlohmann's dump recurses:
/// a payload 300 000 arrays deep overflowed the stack).
std::optional<nlohmann::json> parse_body(const std::string& body, std::string& why) {
  if (!validate_json(body, &why)) return std::nullopt;
  return nlohmann::json::parse(body, nullptr, false);
}

/// The refusal of a request in a tool protocol version other than 1 (one without the field
/// is taken as 1).
std::optional<HttpReply> unsupported_version(const nlohmann::json& j) {
  if (!j.contains("protocol_version")) return std::nullopt;
  const auto& v = j["protocol_version"];
  if (v.is_number_integer() && v.get<std::int64_t>() == 1) return std::nullopt;
  return HttpReply{
      400, refusal("malformed_request", "protocol_version " + v.dump() + " is not supported: this service speaks 1")};
}

}  // namespace

/// {"ok": false, "protocol_version": 1, "error": {"type", "message"}} for a request refused
/// before it reached the host.
std::string refusal(std::string_view type, std::string_view message) {
  std::string out;
  append_literal(out, "{\"ok\":false,\"protocol_version\":1,\"error\":{\"type\":");
  append_json_string(out, type);
  append_literal(out, ",\"message\":");
  append_json_string(out, message);
  append_literal(out, "}}");
  return out;
}

/// The tool protocol's answer for a host response: {ok, result} or {ok: false, error}, with
/// the host's status, code and trace beside them.
std::string protocol_answer(const Response& r) {
  std::string out;
  const ErrorKindInfo& info = error_info(r.kind);
  if (r.ok()) {
    append_literal(out, "{\"ok\":true,\"protocol_version\":1,\"status\":\"OK\",\"result\":");
    out.append(r.output_json.empty() ? std::string_view("null") : std::string_view(r.output_json));
  } else {
    // A tool's own error keeps its own type and message (the trace has them); the host's
    // errors are typed by their code.
    std::string type(info.code), message = r.error, reason;
    if (!r.trace_json.empty()) {
      const auto trace = nlohmann::json::parse(r.trace_json, nullptr, false);
      if (trace.is_object()) {
        if (trace.contains("error_type") && trace["error_type"].is_string()) type = trace["error_type"];
        if (trace.contains("error_message") && trace["error_message"].is_string()) message = trace["error_message"];
        if (trace.contains("reason_code") && trace["reason_code"].is_string()) reason = trace["reason_code"];
      }
    }
    if (reason.empty() && (r.kind == ErrorKind::guarantee_blocked || r.kind == ErrorKind::coverage_missing))
      reason = std::string(info.code);
    append_literal(out, "{\"ok\":false,\"protocol_version\":1,\"status\":\"");
    out.append(status_name(info.status));
    append_literal(out, "\",\"code\":\"");
    out.append(info.code);
    append_literal(out, "\",\"error\":{\"type\":");
    append_json_string(out, type);
    append_literal(out, ",\"message\":");
    append_json_string(out, message);
    if (!reason.empty()) {
      append_literal(out, ",\"reason_code\":");
      append_json_string(out, reason);
    }
    out.push_back('}');
  }
  if (r.idempotent_hit) append_literal(out, ",\"idempotent_hit\":true");
  if (!r.trace_json.empty()) {
    append_literal(out, ",\"trace\":");
    out.append(r.trace_json);
  }
  out.push_back('}');
  return out;
}

std::optional<HttpReply> read_call(const ToolRegistry& tools, const std::string& target, const std::string& body,
                                   Request& req) {
  std::string why;
  const auto parsed = parse_body(body, why);
  if (!parsed) return HttpReply{400, refusal("malformed_request", "the request body is not JSON: " + why)};
  const auto& j = *parsed;
  if (!j.is_object()) return HttpReply{400, refusal("malformed_request", "the request body must be a JSON object")};
  if (auto refused = unsupported_version(j)) return *refused;
  std::string name;
  if (j.contains("tool_name") && j["tool_name"].is_string())
    name = j["tool_name"].get<std::string>();
  else if (target.rfind("/tools/", 0) == 0)
    name = target.substr(7);
  if (name.empty()) return HttpReply{400, refusal("malformed_request", "the request names no tool (tool_name)")};
  std::string why_shared;
  const Tool* tool = find_tool(tools, name, why_shared);
  if (!why_shared.empty()) return HttpReply{404, refusal("tool_not_found", why_shared)};
  req.aid = tool != nullptr ? tool->info.aid : name;  // (an unknown one: tool_not_found from the host)
  if (j.contains("payload")) req.input_json = j["payload"].dump();
  auto text_field = [&](const char* field, std::optional<std::string>& into) -> bool {
    if (!j.contains(field) || j[field].is_null()) return true;
    if (!j[field].is_string()) return false;
    into = j[field].get<std::string>();
    return true;
  };
  if (!text_field("trace_id", req.trace_id) || !text_field("idempotency_key", req.idempotency_key) ||
      !text_field("_lease_token", req.lease_token)) {
    return HttpReply{400, refusal("malformed_request", "trace_id, idempotency_key and _lease_token must be strings")};
  }
  if (j.contains("timeout_ms") && !j["timeout_ms"].is_null()) {
    if (!j["timeout_ms"].is_number_integer()) return HttpReply{400, refusal("malformed_request", kTimeoutRuleText)};
    req.timeout_ms = j["timeout_ms"].get<std::int64_t>();
  }
  return std::nullopt;
}

HttpReply handshake_answer(const ToolRegistry& tools, const std::string& body) {
  std::string why;
  const auto parsed = parse_body(body, why);
  if (!parsed) return {400, refusal("malformed_request", "the request body is not JSON: " + why)};
  const auto& j = *parsed;
  if (!j.is_object() || !j.contains("tool_name") || !j["tool_name"].is_string())
    return {400, refusal("malformed_request", "a handshake names its tool (tool_name)")};
  if (auto refused = unsupported_version(j)) return *refused;
  const std::string name = j["tool_name"].get<std::string>();
  std::string why_shared;
  const Tool* tool = find_tool(tools, name, why_shared);
  if (tool == nullptr) {
    return {404, refusal("tool_not_found", why_shared.empty() ? "tool not found: " + excerpt(name) : why_shared)};
  }
  nlohmann::json supported = nlohmann::json::object();
  for (const auto& g : tool->runner->enforced_guarantees()) supported[g] = true;
  std::size_t required = 0, covered = 0;
  if (j.contains("required_guarantees") && j["required_guarantees"].is_object()) {
    for (const auto& [g, on] : j["required_guarantees"].items()) {
      if (on != true) continue;
      ++required;
      if (supported.contains(g)) ++covered;
    }
  }
  const char* enforcement = covered == required ? "enforced" : covered > 0 ? "partially_enforced" : "not_enforceable";
  const nlohmann::json answer = {{"ok", true},
                                 {"protocol_version", 1},
                                 {"tool_name", tool->info.aid},
                                 {"enforcement", enforcement},
                                 {"supported_guarantees", supported},
                                 {"service_version", MACHINA_VERSION}};
  return {200, answer.dump()};
}

}  // namespace machina::cli
