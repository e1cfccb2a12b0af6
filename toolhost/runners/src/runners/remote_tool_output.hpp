// What a hosted server's answers become: a tool from an entry of tools/list, a tool's output
// from a tools/call result (its structuredContent, its text, or its content blocks) and the
// text of an error's content.
#pragma once

#include <machina/call_context.hpp>
#include <machina/runners/hosted_server.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace machina::remote_output {

/// A JSON value as text: a string as it is, anything else as JSON.
std::string text_of(const nlohmann::json& v);
/// The text of a result's content: a string, or the text blocks of a list of content
/// blocks, one after the other.
std::string content_text(const nlohmann::json& content);
/// A tool's output from a tools/call result: structuredContent when there is one; a
/// string content or a single text block as a JSON string; other content as the list of
/// its blocks; a result without content as it is.
std::string output_of(const nlohmann::json& result);
/// output_of() without a DOM, for the results of every shape but an error: the output is a
/// span of the answer's own JSON text (structuredContent, a string content, a single text
/// block's text, the content list). False for an isError result (or one not an object).
bool fast_output(std::string_view result, std::string& output);
/// What a tools/call result answers the call: its output (MACHINA_TOOL_OK), or its error's
/// text (MACHINA_TOOL_ERROR for an isError result).
int take_result(std::string_view result, CallContext& call);

/// What the trace of a call of a hosted or remote server's tool says ("" and 0: left out).
struct CallTrace {
  std::string_view runner{}, server{}, url{}, tool{}, trace_id{};
  std::int64_t timeout_ms = 0;
  long child_pid = 0;
  int jsonrpc_error = 0;
  double duration_ms = 0;
};
/// The trace as JSON text into `out`, written directly (it is on every call's path).
void write_call_trace(std::string& out, const CallTrace& c);

/// A tool as an entry of tools/list describes it (`mcp`: MCP's field names, else a skill's).
RemoteTool remote_tool_of(const nlohmann::json& entry, bool mcp);

}  // namespace machina::remote_output
