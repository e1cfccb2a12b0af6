// The NATS front's pure text rules: subject tokens, endpoint names, header values, the
// service error codes and "Type: message" errors of the micro-service API, and server URLs
// fit for a log. No NATS client here, so they are tested on their own.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace machina::cli {

/// A server URL (or a comma-separated list of them) fit for a log: any user name, password
/// or token before an '@' is left out.
std::string without_credentials(std::string_view urls);

/// NATS subject tokens: letters, digits, '_' and '-', joined by single dots.
bool subject_safe(std::string_view s);

/// A tool's micro-service endpoint name: its aid (at most 200 bytes) with every byte other
/// than letters, digits, '_' and '-' as '_'; "tool" for an empty aid.
std::string endpoint_name(std::string_view aid);

/// At most `max` bytes of `text`, cut at a character boundary, line breaks as spaces.
std::string header_text(std::string_view text, std::size_t max);

/// The numeric Nats-Service-Error-Code of a failed response (HTTP's meanings).
const char* service_error_code(const std::string& status, const std::string& code);

/// A failure worded "Type: message", as the `tools.*` subjects answer it: a pack tool's
/// message starts with its type already; otherwise the type of its code (error_kinds.def).
std::string typed_error(const std::string& error, const std::string& code);

}  // namespace machina::cli
