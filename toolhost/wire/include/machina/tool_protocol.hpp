// Tool protocol v1 as the host's runners speak it (docs/python-tools.md): the call object a
// Python tool worker reads on stdin and an HTTP tool service receives as its POST body, the
// answer both give back ({ok, result} or {ok: false, error: {type, message, reason_code}}),
// and the `trace` object the host adds to every such call's response.
#pragma once

#include <cstdint>
#include <machina/call_context.hpp>
#include <string>
#include <string_view>

namespace machina::tool_protocol {

inline constexpr int kVersion = 1;

/// One call, as every runner of protocol v1 describes it.
struct Call {
  std::string_view tool;          // the tool's name
  std::string_view entry;         // "module:function" ("" for a service without one)
  std::string_view payload_json;  // the call's input: valid JSON text
  bool sandbox = false;
  std::string_view trace_id;
  std::string_view capability_context_json;  // a JSON object's text, or "" for none
  /// The call's deadline on CLOCK_MONOTONIC, in ms (0: none). Sent to our own workers
  /// (an addition to the protocol, which others ignore): a call still queued when it passes
  /// is answered without being run.
  std::int64_t deadline_monotonic_ms = 0;
};

/// Appends the local runner's request object (no newline): protocol_version, tool, entry,
/// payload, sandbox, trace_id and capability_context.
void encode_local_call(const Call& call, std::string& out);

/// Appends the service runner's request object: protocol_version, tool_name, kind
/// ("python"), entry, payload, timeout_ms, trace_id and project ({app_root, flow}).
void encode_service_call(const Call& call, std::int64_t timeout_ms, std::string_view app_root, std::string& out);

/// An answer as decoded: views into the decoded text for the raw JSON of `result` and
/// `trace`, copies of the error's strings.
struct Answer {
  bool ok = false;
  std::string_view result;  // the raw JSON text of `result` ("null" when absent)
  std::string error_type;   // "ToolError" when the error names none
  std::string error_message;
  std::string reason_code;  // "" when none
  std::string_view trace;   // the raw JSON text of `trace` (an object), "" when absent
};

/// Decodes an answer object. False, with `why`, if it is not one: not JSON, not an object,
/// no boolean `ok`. An `error` may be an object or a bare message; a `trace` that is not
/// an object is ignored.
bool decode_answer(std::string_view text, Answer& out, std::string& why);

/// What an answer says of the call: its result as the output (unless over the cap), or its
/// error as "ErrorType: message". Returns the tool's result code (MACHINA_TOOL_OK or
/// MACHINA_TOOL_ERROR).
int apply_answer(const Answer& answer, CallContext& call);

/// A fresh trace id: a random (version 4) UUID.
std::string new_trace_id();

}  // namespace machina::tool_protocol
