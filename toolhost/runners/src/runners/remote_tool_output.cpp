// See remote_tool_output.hpp.
#include "remote_tool_output.hpp"

#include <machina/json_text.hpp>
#include <machina/jsonrpc.hpp>

#include <cstdio>

namespace machina::remote_output {

using json = nlohmann::json;

std::string text_of(const json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}

std::string content_text(const json& content) {
  if (content.is_string()) return content.get<std::string>();
  std::string out;
  if (content.is_array()) {
    for (const auto& block : content) {
      if (block.is_object() && block.value("type", "") == "text" && block.contains("text") &&
          block["text"].is_string()) {
        if (!out.empty()) out += "\n";
        out += block["text"].get<std::string>();
      }
    }
  }
  return out.empty() ? content.dump() : out;
}

std::string output_of(const json& result) {
  if (!result.is_object()) return result.dump();
  if (result.contains("structuredContent") && !result["structuredContent"].is_null())
    return result["structuredContent"].dump();
  if (!result.contains("content")) return result.dump();
  const json& content = result["content"];
  if (content.is_string()) return json(content.get<std::string>()).dump();
  if (content.is_array() && content.size() == 1 && content[0].is_object() && content[0].value("type", "") == "text" &&
      content[0].contains("text") && content[0]["text"].is_string())
    return json(content[0]["text"].get<std::string>()).dump();
  return content.dump();
}

bool fast_output(std::string_view result, std::string& output) {
  using jsonrpc::Member;
  std::string_view structured, content;
  Member::Type content_type = Member::Type::null;
  bool error = false;
  std::string why;
  const bool ok = jsonrpc::for_each_member(
      result,
      [&](const Member& m) {
        if (m.key == "structuredContent" && m.type != Member::Type::null)
          structured = m.raw;
        else if (m.key == "content")
          content = m.raw, content_type = m.type;
        else if (m.key == "isError" && m.raw == "true")
          error = true;
        return true;
      },
      why);
  if (!ok || error) return false;
  if (!structured.empty()) {
    output.assign(structured);
  } else if (content.empty()) {
    output.assign(result);
  } else if (content_type == Member::Type::string) {
    output.assign(content);
  } else {
    // A list of one text block: its text (a JSON string as written); any other list as it is.
    std::string_view only, text;
    int count = 0;
    if (content_type == Member::Type::array) {
      jsonrpc::for_each_element(
          content,
          [&](const Member& m) {
            only = m.raw;
            return ++count < 2;
          },
          why);
    }
    if (count == 1 && !only.empty() && only.front() == '{') {
      bool is_text = false;
      jsonrpc::for_each_member(
          only,
          [&](const Member& m) {
            if (m.key == "type")
              is_text = m.type == Member::Type::string && m.string == "text";
            else if (m.key == "text" && m.type == Member::Type::string)
              text = m.raw;
            return true;
          },
          why);
      if (!is_text) text = {};
    }
    output.assign(text.empty() ? content : text);
  }
  return true;
}

int take_result(std::string_view result, CallContext& call) {
  std::string output;
  if (!fast_output(result, output)) {
    const auto parsed = nlohmann::json::parse(result, nullptr, false);
    if (parsed.is_object() && parsed.value("isError", false) == true) {
      call.error = content_text(parsed.value("content", nlohmann::json(""))).substr(0, kMaxToolErrorBytes);
      if (call.error.empty()) call.error = "the tool reported an error";
      return MACHINA_TOOL_ERROR;
    }
    output = output_of(parsed);
  }
  call.set_output(std::move(output));
  return MACHINA_TOOL_OK;
}

RemoteTool remote_tool_of(const nlohmann::json& t, bool mcp) {
  RemoteTool r;
  r.name = t.value("name", "");
  r.title = t.contains("title") && t["title"].is_string() ? t["title"].get<std::string>() : "";
  r.description = t.contains("description") && t["description"].is_string() ? t["description"].get<std::string>() : "";
  const char* schema_key = mcp ? "inputSchema" : "parameters";
  if (t.contains(schema_key) && t[schema_key].is_object())
    r.input_schema = t[schema_key].dump();
  else if (!mcp && t.contains("inputSchema") && t["inputSchema"].is_object())
    r.input_schema = t["inputSchema"].dump();
  if (t.contains("outputSchema") && t["outputSchema"].is_object()) r.output_schema = t["outputSchema"].dump();
  if (t.contains("annotations") && t["annotations"].is_object()) r.annotations = t["annotations"].dump();
  return r;
}

void write_call_trace(std::string& t, const CallTrace& c) {
  t = "{\"runner\":";
  append_json_string(t, c.runner);
  t += ",\"server\":";
  append_json_string(t, c.server);
  if (!c.url.empty()) {
    t += ",\"url\":";
    append_json_string(t, c.url);
  }
  t += ",\"tool\":";
  append_json_string(t, c.tool);
  t += ",\"timeout_ms\":" + std::to_string(c.timeout_ms);
  if (!c.trace_id.empty()) {
    t += ",\"trace_id\":";
    append_json_string(t, c.trace_id);
  }
  if (c.child_pid > 0) t += ",\"child_pid\":" + std::to_string(c.child_pid);
  if (c.jsonrpc_error != 0) t += ",\"jsonrpc_error\":" + std::to_string(c.jsonrpc_error);
  char ms[32];
  std::snprintf(ms, sizeof ms, "%.3f", c.duration_ms);
  t += ",\"duration_ms\":";
  t += ms;
  t += '}';
}

}  // namespace machina::remote_output
