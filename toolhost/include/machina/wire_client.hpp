// The wire seen from a client: encoding requests and reading responses, as the Python
// pool and spawn transports do. The inverse of wire.hpp, kept next to it so both ends
// of the protocol are written (and fuzzed) in one place.
#pragma once

#include <machina/request.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace machina {

/// Appends one request line (ending in '\n'). `id` is written when set; `ds_state_json`,
/// when set, must be a JSON object (it is copied as it is).
void encode_request(const Request& request, std::optional<std::int64_t> id, std::string_view ds_state_json,
                    std::string& out);

/// One response as a client reads it. Strings are decoded; `ds_state` is the raw text of
/// the response's ds_state object (a view into the decoded text), empty if it had none.
struct ResponseFields {
  std::optional<std::int64_t> id;
  bool ok = false;
  std::optional<std::string> status;
  std::string output_json;
  std::string error;
  std::optional<std::string> code;
  bool idempotent_hit = false;
  std::string_view ds_state;
  std::optional<std::int64_t> lease_tier;
  std::optional<std::string> lease_aid;
  std::optional<std::string> lease_reason;
};

/// Decodes one response line (without its '\n'). False, with `why`, if it is not a
/// response object (not JSON, not an object, a known field of the wrong type, no `ok`).
bool decode_response(std::string_view text, ResponseFields& out, std::string& why);

}  // namespace machina
