// See ndjson_front.hpp.
#include <machina/ndjson_front.hpp>
#include <machina/ndjson_wire.hpp>

namespace machina::ndjson {
namespace {

Response decode_and_handle(Host& host, std::string_view text, CallerState& session, FrontLabel front,
                           OverrunSink* overrun_sink, std::string_view run_aid, bool nul_terminated) {
  Request request;
  request.front = front;
  Response error;
  if (!decode_request(text, request, error, nul_terminated, /*aid_required=*/run_aid.empty())) return error;
  if (!run_aid.empty()) {
    if (!request.aid.empty() && request.aid != run_aid) {
      error = Response::failure(ErrorKind::malformed_request, "malformed request: the body names aid '" + request.aid +
                                                                  "' but the command line names '" +
                                                                  std::string(run_aid) + "'");
      error.id_json = std::move(request.id_json);
      return error;
    }
    request.aid = run_aid;
  }
  return host.handle(request, session, overrun_sink);
}

}  // namespace

Handled respond(Host& host, std::string_view text, CallerState& session, std::string& out, FrontLabel front,
                OverrunSink* overrun_sink, std::string_view run_aid, bool nul_terminated) {
  if (text.size() > host.options().max_request_bytes) {
    respond_too_large(host, out);
    return {};
  }
  const Response response = decode_and_handle(host, text, session, front, overrun_sink, run_aid, nul_terminated);
  if (response.overran) return {false, true};
  encode_response(response, out);
  return {!response.id_json.empty(), false};
}

void respond_too_large(const Host& host, std::string& out) {
  encode_response(host.request_too_large(), out);
}

}  // namespace machina::ndjson
