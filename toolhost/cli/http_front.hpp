// The HTTP front (`machina-toolhost --http HOST:PORT`): the host as an HTTP tool service of
// tool protocol v1. POST with the protocol's service request ({tool_name, payload, timeout_ms,
// trace_id, ...}) runs a tool through Host::handle and answers {ok, result} or {ok: false,
// error}; POST /capabilities/handshake answers which guarantees are really enforced for a
// tool. Optional bearer-token auth; bodies bounded; keep-alive connections, one thread each,
// bounded in number. Boost.Beast parses and writes the messages.
#pragma once

#include <machina/host.hpp>

#include <functional>
#include <string>

namespace machina::cli {

struct HttpFrontOptions {
  std::string host = "127.0.0.1";
  std::string port = "8080";           // "0": any free port (said on stderr)
  std::string token;                   // bearer token every request must carry ("": none)
  std::size_t max_body_bytes = kMaxRequestBytes;
  std::size_t max_connections = 256;   // beyond: 503
  int idle_timeout_ms = 60'000;        // a kept-alive connection with no request is closed
  int read_timeout_ms = 30'000;        // a request must arrive whole within this once begun
};

/// Serves until SIGINT or SIGTERM; returns the exit code. Throws HostError if it cannot listen.
int serve_http(Host& host, const HttpFrontOptions& options);

}  // namespace machina::cli
