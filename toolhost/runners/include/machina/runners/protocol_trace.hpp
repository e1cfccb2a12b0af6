// What the runners of tool protocol v1 (Python, service, container) write alike into a
// call's trace: where the tool comes from (a manifest's own binding or a namel3ss pack, and
// what declares the dependencies of its code), and the tool's own error.
#pragma once

#include <machina/tool_protocol.hpp>

#include <nlohmann/json.hpp>

#include <string>

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

/// A failed answer's error_type, error_message and reason_code (if any); nothing for ok.
inline void write_answer_error(const tool_protocol::Answer& answer, nlohmann::ordered_json& trace) {
  if (answer.ok) return;
  trace["error_type"] = answer.error_type;
  trace["error_message"] = answer.error_message;
  if (!answer.reason_code.empty()) trace["reason_code"] = answer.reason_code;
}

}  // namespace machina
