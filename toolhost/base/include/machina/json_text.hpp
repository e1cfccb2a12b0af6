// Small JSON text helpers for the hot path: validation without building a DOM and
// string escaping straight into an output buffer.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace machina {

/// Nesting limit for any JSON the host parses (requests, inputs, outputs, slots).
inline constexpr std::size_t kMaxJsonDepth = 512;

/// Validates one JSON text (no trailing content) without building a DOM. On failure
/// returns false and, if `why` is given, a short reason with the byte offset.
bool validate_json(std::string_view text, std::string* why = nullptr, std::size_t max_depth = kMaxJsonDepth);
/// The same for a std::string, whose terminating NUL lets the fast path read faster.
bool validate_json(const std::string& text, std::string* why = nullptr, std::size_t max_depth = kMaxJsonDepth);

namespace detail {
/// validate_json with the reference parser (nlohmann) alone, never the fast path; for
/// tests that check both paths accept exactly the same texts.
bool validate_json_reference(std::string_view text, std::string* why = nullptr, std::size_t max_depth = kMaxJsonDepth);
/// True if `s` is well-formed UTF-8 without a byte below 0x20.
bool is_utf8_without_controls(std::string_view s) noexcept;
/// True if the JSON number `text` is within a double's range, as nlohmann requires (it
/// refuses 1e400). Only a number with an exponent or over 300 characters can be past it:
/// other texts are answered without converting.
bool number_fits_double(std::string_view text);
}  // namespace detail

/// "invalid JSON at byte N: <reason>" from a nlohmann parse error, without echoing
/// the offending bytes (they may not be UTF-8).
std::string describe_parse_error(std::size_t position, const std::string& what);

/// Byte-level checks the parsers do not make: a NUL byte (nlohmann reads it as the end
/// of input) and a leading byte order mark (nlohmann skips it). Returns the reason
/// ("invalid JSON at byte N: ...") or an empty string if neither is present.
std::string reject_raw_bytes(std::string_view text);

/// True if `s` is well-formed UTF-8.
bool is_valid_utf8(std::string_view s) noexcept;

/// `s` with every ill-formed UTF-8 sequence replaced by U+FFFD, for text that comes
/// from a tool and goes into a response.
std::string to_valid_utf8(std::string_view s);

/// At most this many characters of a client's own text go back in an error message.
inline constexpr std::size_t kMaxEchoChars = 200;

/// `s` as an error message may quote it: whole if it has at most kMaxEchoChars characters
/// (code points), else its first kMaxEchoChars followed by "… (N bytes)". `s` is valid
/// UTF-8 (decoded JSON text); the cut falls between characters.
std::string excerpt(std::string_view s);

/// Whether JSON text `text` is an object: its first byte after white space is '{'.
bool starts_json_object(std::string_view text) noexcept;

/// Appends `s` as a JSON string literal (with quotes) to `out`.
void append_json_string(std::string& out, std::string_view s);

/// Appends a string literal (its length known when compiled, not measured when run).
template <std::size_t N>
void append_literal(std::string& out, const char (&literal)[N]) {
  out.append(literal, N - 1);
}

}  // namespace machina
