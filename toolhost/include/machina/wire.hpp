// The NDJSON wire codec shared by --run, --serve and _core: request decoding by SAX
// (no DOM per request) and a direct response writer.
#pragma once

#include <machina/request.hpp>

#include <optional>
#include <string>
#include <string_view>

namespace machina {

/// Decodes one request object. On failure returns a ready error Response in `error`
/// (kind malformed_request or invalid_ds_state; it echoes the id if the text is valid
/// JSON) and false. `nul_terminated`: text[size] is readable and '\0' (faster).
bool decode_request(std::string_view text, Request& request, Response& error, bool nul_terminated = false);

namespace detail {
/// decode_request with the reference parser (nlohmann) alone; for tests that check the
/// fast path decodes exactly as the reference does.
bool decode_request_reference(std::string_view text, Request& request, Response& error);
}  // namespace detail

/// For a request built directly rather than decoded (the Python fast path): the size cap
/// (over the fields' sizes plus `extra_bytes`, e.g. an encoded ds_state) and the field
/// rules the decoder applies, with the same messages. nullopt if the request is fine.
std::optional<Response> check_request(const Request& request, std::size_t extra_bytes, std::size_t max_bytes);

/// Decodes a ds_state object on its own (used by _core and the fuzz target).
bool decode_ds_state(std::string_view text, DsUpdate& update, std::string& why);

/// Appends the response as one JSON object followed by '\n'.
void encode_response(const Response& response, std::string& out);

/// Appends a ds_state report / a set of slots as a JSON object.
void encode_ds_state(const DsReport& report, std::string& out);

}  // namespace machina
