// The HTTP front (`machina-toolhost --http HOST:PORT`): the host as an HTTP tool service of
// tool protocol v1. POST with the protocol's service request ({tool_name, payload, timeout_ms,
// trace_id, ...}) runs a tool through Host::handle and answers {ok, result} or {ok: false,
// error}; POST /capabilities/handshake answers which guarantees are really enforced for a
// tool. Optional bearer-token auth (required off loopback); only its own Host names, allowed
// Origins and JSON bodies are served (a web page in a local browser reaches no tool); bodies
// bounded; framing a proxy could read otherwise is refused; keep-alive connections, one
// thread each, bounded in number and per peer address, with a deadline for the headers.
// Boost.Beast parses and writes the messages.
#pragma once

#include "stop_signal.hpp"

#include <machina/host.hpp>

#include <functional>
#include <string>
#include <vector>

namespace machina::cli {

struct HttpFrontOptions {
  std::string host = "127.0.0.1";
  std::string port = "8080";               // "0": any free port (said on stderr)
  std::string token;                       // bearer token every request must carry ("": none; loopback only)
  std::vector<std::string> allow_origins;  // Origin values served (any other Origin: 403)
  std::vector<std::string> allow_hosts;    // Host names served beside the bound address; "NAME:PORT" pins the port
  std::size_t max_body_bytes = kMaxRequestBytes;
  std::size_t max_connections = 256;          // beyond: 503
  std::size_t max_connections_per_peer = 32;  // from one client address; beyond: 503
  int header_timeout_ms = 10'000;  // a request's headers must arrive within this (a new connection's: from accept)
  int idle_timeout_ms = 60'000;    // a kept-alive connection with no request is closed
  int read_timeout_ms = 30'000;    // a request must arrive whole within this once begun
  // MCP over Streamable HTTP at /mcp (http_mcp.hpp).
  std::size_t mcp_page_size = 100;     // tools per tools/list page
  std::size_t max_mcp_sessions = 256;  // beyond: the least recently used idle one goes
};

/// Throws ConfigError for options that must not be served: a non-loopback address without a
/// token, a malformed allowed Origin or Host name.
void check_http_front_options(const HttpFrontOptions& options);

/// Serves until `control` says stop (by default SIGINT or SIGTERM); returns the exit code: 0,
/// or 1 when connections were still inside tools 5 s after the stop (their threads still use
/// the host: the program must then exit without destroying it). Throws ConfigError if it
/// cannot listen or check_http_front_options refuses the options.
int serve_http(Host& host, const HttpFrontOptions& options, const FrontControl& control = {});

}  // namespace machina::cli
