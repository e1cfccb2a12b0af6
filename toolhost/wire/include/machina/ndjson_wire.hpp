// The NDJSON wire format (one request or response object per line) shared by --run,
// --serve and _core: request decoding by SAX (no DOM per request) and a direct response
// writer. The ds_state object it carries has its own codec (ds_state_codec.hpp).
#pragma once

#include <machina/ds_state_codec.hpp>
#include <machina/request.hpp>

#include <optional>
#include <string>
#include <string_view>

namespace machina {

/// Decodes one request object: its shape and the types of its fields (the rules on their
/// values are the host's, see Host::handle). On failure returns a ready error Response in
/// `error` (kind malformed_request or invalid_ds_state; it echoes the id if the text is
/// valid JSON) and false. `nul_terminated`: text[size] is readable and '\0' (faster).
/// `aid_required`: an object without `aid` is malformed (not for --run, whose aid is on
/// the command line).
bool decode_request(std::string_view text, Request& request, Response& error, bool nul_terminated = false,
                    bool aid_required = true);

namespace detail {
/// decode_request with the reference parser (nlohmann) alone; for tests that check the
/// fast path decodes exactly as the reference does.
bool decode_request_reference(std::string_view text, Request& request, Response& error, bool aid_required = true);
}  // namespace detail

/// Appends the response as one JSON object followed by '\n'.
void encode_response(const Response& response, std::string& out);

}  // namespace machina
