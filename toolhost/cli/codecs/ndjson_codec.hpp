// The NDJSON wire format (docs/protocol.md) on stdio: --serve's lines (a LineCodec for the line server) and
// --run's one request on stdin.
#pragma once

#include "../line_server.hpp"

namespace machina::cli {

class NdjsonCodec final : public LineCodec {
 public:
  Handled handle(Host& host, std::string_view line, CallerState& session, std::string& out,
                 OverrunSink* overrun_sink) override;
  void answer_too_large(Host& host, std::string_view head, std::string& out) override;
  void encode(const Response& response, std::string& out) override;
};

/// The --run front: one request from in_fd (at most the host's request cap; empty input
/// is a malformed request), one response to out_fd, `aid` from the command line.
int run_once(Host& host, std::string_view aid, int in_fd, int out_fd);

}  // namespace machina::cli
