// What the runners of tool protocol v1 (Python, service, container) write alike into a
// call's trace: where the tool comes from (a manifest's own binding or a namel3ss pack, and
// what declares the dependencies of its code), and the tool's own error.
#pragma once

#include <machina/tool_protocol.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace machina {

struct ToolSource {
  std::string resolved_source = "binding";       // or "installed_pack" for a pack's tool
  std::string pack_id, pack_name, pack_version;  // a pack's tool: its pack ("" otherwise)
  std::string deps_source;                       // what declares its dependencies ("": not the host's to say)

  /// Adds resolved_source, the pack's fields (a pack's tool only) and deps_source (if said).
  void write_to(nlohmann::ordered_json& trace) const {
    trace["resolved_source"] = resolved_source;
    if (!pack_id.empty()) {
      trace["pack_id"] = pack_id;
      trace["pack_name"] = pack_name;
      trace["pack_version"] = pack_version;
    }
    if (!deps_source.empty()) trace["deps_source"] = deps_source;
  }
};

/// The fields every such trace starts with: runner, kind ("python"), the tool's source,
/// tool, entry, protocol_version and the call's timeout_ms.
inline nlohmann::ordered_json call_trace_head(std::string_view runner, const ToolSource& source, std::string_view tool,
                                              std::string_view entry, std::int64_t timeout_ms) {
  nlohmann::ordered_json trace = nlohmann::ordered_json::object();
  trace["runner"] = runner;
  trace["kind"] = "python";
  source.write_to(trace);
  trace["tool"] = tool;
  trace["entry"] = entry;
  trace["protocol_version"] = tool_protocol::kVersion;
  trace["timeout_ms"] = timeout_ms;
  return trace;
}

/// A failed answer's error_type, error_message and reason_code (if any); nothing for ok.
inline void write_answer_error(const tool_protocol::Answer& answer, nlohmann::ordered_json& trace) {
  if (answer.ok) return;
  trace["error_type"] = answer.error_type;
  trace["error_message"] = answer.error_message;
  if (!answer.reason_code.empty()) trace["reason_code"] = answer.reason_code;
}

}  // namespace machina
