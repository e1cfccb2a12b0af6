// The forms a call comes in on the NATS front, and the answer each gets: our request
// envelope (answered with our response line), an OpenAI tool call (answered with the tool
// message), or the tool's own input (answered {data, error}). A body that is not our
// envelope takes the call options from headers; a failed call's answer carries the
// micro-service error headers. docs/nats.md, "Message forms".
#pragma once

#include <machina/tool_registry.hpp>

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace machina::cli {

enum class Form { envelope, openai, tool_input };

/// A message's header by name: its value, or null without one.
using HeaderLookup = std::function<const char*(const char* name)>;
/// Headers of an answer, by name.
using AnswerHeaders = std::vector<std::pair<const char*, std::string>>;

// The call options a message carries in headers.
inline constexpr char kHdrIdempotencyKey[] = "Idempotency-Key";
inline constexpr char kHdrLease[] = "Machina-Lease";
inline constexpr char kHdrUser[] = "Machina-User";
inline constexpr char kHdrTimeoutMs[] = "Machina-Timeout-Ms";
// A failed call's answer: the micro-service error headers and our wire code.
inline constexpr char kHdrError[] = "Nats-Service-Error";
inline constexpr char kHdrErrorCode[] = "Nats-Service-Error-Code";
inline constexpr char kHdrWireCode[] = "Machina-Error-Code";

/// What a message asks the host, and how its answer goes back.
struct MessageCall {
  Form form = Form::envelope;
  std::string request;                      // the NDJSON request line for the host
  std::string run_aid;                      // an envelope on a tool's subject: that tool ("": the request names it)
  std::string tool_call_id, function_name;  // Form::openai
};

/// Reads the message `data` on `subject`, whose tool is `subject_aid` ("" when the request
/// names its tool); `tools` resolves an OpenAI call's function name. False with `refusal` set
/// to our response line when the message cannot be a call (`call.form` then says how to
/// answer it).
bool read_message(const ToolRegistry& tools, std::string_view subject, std::string_view subject_aid,
                  std::string_view data, const HeaderLookup& header, MessageCall& call, std::string& refusal);

/// The answer to a call for the host's response `line`.
struct FormAnswer {
  bool ok = false;
  std::string error;  // the failure's message (ok: "")
  std::string body;
  AnswerHeaders headers;  // the error headers of a failure
};
FormAnswer answer_in_form(const MessageCall& call, std::string_view line);

}  // namespace machina::cli
