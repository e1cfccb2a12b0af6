// MCP over Streamable HTTP on the HTTP front (its /mcp endpoint): each JSON-RPC message is
// one POST, answered with one JSON body (400 for one that cannot be read), or 202 with none
// for a notification or a cancellation. An initialize answered with a result opens a session,
// named by the Mcp-Session-Id header of its answer, that keeps what a stdio connection keeps
// (the revision, cancellations, ds_state; hosted skills are told it began and ended); only its
// caller uses it; DELETE ends it; an unknown one is 404. A message without a session is
// served on its own: the 2026-07-28 revision has no session. Sessions are bounded in number;
// the least recently used idle one makes room. The HTTP front's admission (Host, Origin,
// token) comes first. docs/mcp-and-skills.md.
#pragma once

#include "http_tool_protocol.hpp"

#include <machina/host.hpp>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

namespace machina::cli {

inline constexpr char kMcpSessionHeader[] = "Mcp-Session-Id";

class McpOverHttp {
 public:
  McpOverHttp(Host& host, std::size_t page_size, std::size_t max_sessions);
  ~McpOverHttp();

  /// Writes a late answer (a call answered at its deadline while its tool still runs) as
  /// the body of the request's HTTP response.
  using LateAnswer = std::function<void(std::string body)>;

  /// The answer to a POST of `body` in session `session_id` ("": none) from `caller` (its
  /// identity for the audit store); status 0 when `late` answered it.
  HttpReply post(std::string_view session_id, const std::string& body, const std::string& caller,
                 const LateAnswer& late);
  /// The answer to a DELETE of session `session_id` by `caller`.
  HttpReply end(std::string_view session_id, const std::string& caller);

  std::size_t sessions() const;

 private:
  struct Session;
  /// Keeps `session` under a new `id`; `ended`: the session it took the place of, if any.
  /// False when every kept session is in use.
  bool keep_session(std::shared_ptr<Session> session, std::string& id, std::string& ended);

  Host& host_;
  std::size_t page_size_;
  std::size_t max_sessions_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<Session>> sessions_;
};

}  // namespace machina::cli
