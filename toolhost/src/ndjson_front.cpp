// See ndjson_front.hpp.
#include <machina/ndjson_front.hpp>
#include <machina/wire.hpp>
#include <machina/wire_client.hpp>

namespace machina::ndjson {
namespace {

/// `replayed`: answer with it (Host::replay) instead of running the call.
Response decode_and_handle(Host& host, std::string_view text, Session& session, Takeover* takeover,
                           std::string_view run_aid, bool nul_terminated, Front front, Response* replayed = nullptr) {
  Request request;
  request.front = front;
  Response error;
  if (!decode_request(text, request, error, nul_terminated, /*aid_required=*/run_aid.empty())) return error;
  if (!run_aid.empty()) {
    if (!request.aid.empty() && request.aid != run_aid) {
      error = Response::failure(ErrorKind::malformed_request, "malformed request: the body names aid '" +
                                                                 request.aid + "' but the command line names '" +
                                                                 std::string(run_aid) + "'");
      error.id_json = std::move(request.id_json);
      return error;
    }
    request.aid = run_aid;
  }
  if (replayed != nullptr) return host.replay(request, session, std::move(*replayed));
  return host.handle(request, session, takeover);
}

/// A response line as the Response it encodes.
Response stored_response(std::string_view stored) {
  ResponseFields fields;
  std::string why;
  if (!decode_response(stored, fields, why)) {
    return Response::failure(ErrorKind::internal_error, "internal error: the stored answer is not a response: " + why);
  }
  Response r;
  if (!fields.ok) {
    r.kind = ErrorKind::internal_error;
    for (const auto& info : all_error_kinds()) {
      if (fields.code && info.code == *fields.code) r.kind = info.kind;
    }
    r.error = std::move(fields.error);
  }
  r.output_json = std::move(fields.output_json);
  r.idempotent_hit = fields.idempotent_hit;
  r.trace_json = std::string(fields.trace);
  return r;
}

}  // namespace

Handled respond(Host& host, std::string_view text, Session& session, std::string& out, Takeover* takeover,
                std::string_view run_aid, bool nul_terminated, Front front) {
  if (text.size() > host.options().max_request_bytes) {
    respond_too_large(host, out);
    return {};
  }
  const Response response = decode_and_handle(host, text, session, takeover, run_aid, nul_terminated, front);
  if (response.abandoned) return {false, true};
  encode_response(response, out);
  return {!response.id_json.empty(), false};
}

void replay(Host& host, std::string_view text, std::string_view stored, Session& session, std::string& out,
            std::string_view run_aid, Front front) {
  if (text.size() > host.options().max_request_bytes) {
    respond_too_large(host, out);
    return;
  }
  Response answer = stored_response(stored);
  encode_response(decode_and_handle(host, text, session, nullptr, run_aid, false, front, &answer), out);
}

void respond_too_large(const Host& host, std::string& out) { encode_response(host.request_too_large(), out); }

}  // namespace machina::ndjson
