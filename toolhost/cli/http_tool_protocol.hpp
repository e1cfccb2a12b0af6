// Tool protocol v1 as the HTTP front speaks it: a call's body ({tool_name, payload,
// timeout_ms, trace_id, idempotency_key, _lease_token, protocol_version}) read into a host
// request, a host response written as {ok, result} or {ok: false, error}, the answer to a
// capabilities handshake, and the refusal of a request that reaches no tool.
#pragma once

#include <machina/request.hpp>
#include <machina/tool_registry.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace machina::cli {

/// An HTTP status, the JSON body that goes with it ("": none) and header fields of its own.
struct HttpReply {
  using Headers = std::vector<std::pair<std::string, std::string>>;
  HttpReply(unsigned status_ = 0, std::string body_ = {}, Headers headers_ = {})
      : status(status_), body(std::move(body_)), headers(std::move(headers_)) {}
  unsigned status;
  std::string body;
  Headers headers;
};

/// {"ok": false, "protocol_version": 1, "error": {"type", "message"}}.
std::string refusal(std::string_view type, std::string_view message);

/// The answer for a host response: {ok, result} or {ok: false, error}, with the host's
/// status, code and trace beside them.
std::string protocol_answer(const Response& response);

/// Fills `req`'s tool and call fields from a call's body (`target`, the request's path, names
/// the tool as /tools/NAME when the body does not); a refusal when the body cannot be a call.
/// A tool name `tools` does not know is left for the host to answer tool_not_found.
std::optional<HttpReply> read_call(const ToolRegistry& tools, const std::string& target, const std::string& body,
                                   Request& req);

/// The answer to a capabilities handshake: which of the guarantees the body asks for the
/// tool's runner enforces.
HttpReply handshake_answer(const ToolRegistry& tools, const std::string& body);

}  // namespace machina::cli
