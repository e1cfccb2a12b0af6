// See ndjson_codec.hpp.
#include "ndjson_codec.hpp"

#include "../line_reader.hpp"

#include <machina/ndjson_front.hpp>
#include <machina/ndjson_wire.hpp>

#include <unistd.h>

namespace machina::cli {
namespace {

// How --serve and --run label their requests: their callers run as this process's OS user.
constexpr FrontLabel kServeFront{"serve", /*local_caller=*/true};
constexpr FrontLabel kRunFront{"run", /*local_caller=*/true};

/// --run: the one response goes out at the deadline even if the tool never returns;
/// the process then ends, since its only job is done.
class RunOverrunSink final : public OverrunSink {
 public:
  RunOverrunSink(const Host& host, int out_fd) : host_(host), out_fd_(out_fd) {}
  void deliver(Response response) override {
    std::string out;
    encode_response(response, out);
    write_all(out_fd_, out);
    host_.flush_audit();  // (the host recorded the timeout before handing it over)
    _exit(0);
  }

 private:
  const Host& host_;
  int out_fd_;
};

}  // namespace

LineCodec::Handled NdjsonCodec::handle(Host& host, std::string_view line, CallerState& session, std::string& out,
                                       OverrunSink* overrun_sink) {
  const auto handled =
      ndjson::respond(host, line, session, out, kServeFront, overrun_sink, {}, /*nul_terminated=*/true);
  return {handled.has_id, handled.overran};
}

void NdjsonCodec::answer_too_large(Host& host, std::string_view /*head*/, std::string& out) {
  ndjson::respond_too_large(host, out);
}

void NdjsonCodec::encode(const Response& response, std::string& out) {
  encode_response(response, out);
}

int run_once(Host& host, std::string_view aid, int in_fd, int out_fd) {
  std::string body;
  std::string out;
  if (!read_all_bounded(in_fd, host.options().max_request_bytes, body)) {
    ndjson::respond_too_large(host, out);
  } else if (body.find_first_not_of(" \t\r\n") == std::string::npos) {
    // Not a call with {}: a client that sent nothing has a bug worth seeing.
    encode_response(Response::failure(ErrorKind::malformed_request,
                                      "malformed request: no request on stdin (--run reads one JSON object)"),
                    out);
  } else {
    CallerState session(/*respond_with_delta=*/false);
    RunOverrunSink overrun_sink(host, out_fd);
    ndjson::respond(host, body, session, out, kRunFront, &overrun_sink, aid, /*nul_terminated=*/true);
  }
  write_all(out_fd, out);
  return 0;
}

}  // namespace machina::cli
