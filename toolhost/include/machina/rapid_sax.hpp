// Fast path for JSON parsing: RapidJSON's SAX reader feeding handlers written against
// nlohmann's SAX interface. RapidJSON only ever *accepts*: on any failure the caller
// parses again with nlohmann, which decides and explains, so both paths accept exactly
// the same documents and every error message comes from one place.
#pragma once

#include <machina/json_text.hpp>

#include <rapidjson/memorystream.h>
#include <rapidjson/reader.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

namespace machina::detail {

/// Adapts RapidJSON events to a handler with nlohmann's SAX member functions.
template <class Sax>
class RapidToNlohmann {
 public:
  explicit RapidToNlohmann(Sax& sax) : sax_(sax) {}

  bool Null() { return sax_.null(); }
  bool Bool(bool b) { return sax_.boolean(b); }
  // Numbers arrive as text (kParseNumbersAsStringsFlag) and are classified as nlohmann
  // does: integers that fit 64 bits are integers, everything else is a float.
  bool RawNumber(const char* s, rapidjson::SizeType n, bool) {
    const char* end = s + n;
    if (std::memchr(s, '.', n) == nullptr && std::memchr(s, 'e', n) == nullptr &&
        std::memchr(s, 'E', n) == nullptr) {
      if (*s == '-') {
        std::int64_t v = 0;
        auto [p, ec] = std::from_chars(s, end, v);
        if (ec == std::errc() && p == end) return sax_.number_integer(v);
      } else {
        std::uint64_t v = 0;
        auto [p, ec] = std::from_chars(s, end, v);
        if (ec == std::errc() && p == end) return sax_.number_unsigned(v);
      }
    }
    // nlohmann refuses a number that overflows a double (1e400); let it decide.
    scratch_.assign(s, n);
    const double d = std::strtod(scratch_.c_str(), nullptr);
    if (!std::isfinite(d)) {
      undecided_ = true;
      return false;
    }
    return sax_.number_float(d, scratch_);
  }
  bool String(const char* s, rapidjson::SizeType n, bool) {
    if (!text(s, n)) return false;
    return sax_.string(scratch_);
  }
  bool Key(const char* s, rapidjson::SizeType n, bool) {
    if (!text(s, n)) return false;
    return sax_.key(scratch_);
  }

  // A handler that declares `static constexpr bool kIgnoresText = true` gets an empty
  // string instead of a copy of each string and key.
  static constexpr bool kCopiesText = !requires { Sax::kIgnoresText; };
  bool StartObject() { return sax_.start_object(static_cast<std::size_t>(-1)); }
  bool EndObject(rapidjson::SizeType) { return sax_.end_object(); }
  bool StartArray() { return sax_.start_array(static_cast<std::size_t>(-1)); }
  bool EndArray(rapidjson::SizeType) { return sax_.end_array(); }
  // Never called with kParseNumbersAsStringsFlag; required by the handler concept.
  bool Int(int) { return false; }
  bool Uint(unsigned) { return false; }
  bool Int64(std::int64_t) { return false; }
  bool Uint64(std::uint64_t) { return false; }
  bool Double(double) { return false; }

  /// True if the parse stopped at something RapidJSON takes but nlohmann may not (a
  /// string that decodes to ill-formed UTF-8 such as a lone low surrogate escape, a
  /// number that overflows a double): nlohmann must judge that document.
  bool needs_second_opinion() const { return undecided_; }

 private:
  // RapidJSON runs without its own encoding check: checking the decoded text is
  // enough (raw bytes pass through; escapes decode to UTF-8, a lone low surrogate
  // escape to an ill-formed sequence) and costs one pass instead of two.
  bool text(const char* s, std::size_t n) {
    if (!is_valid_utf8(std::string_view(s, n))) {
      undecided_ = true;
      return false;
    }
    if constexpr (kCopiesText) scratch_.assign(s, n);
    return true;
  }

  Sax& sax_;
  std::string scratch_;
  bool undecided_ = false;
};

inline constexpr unsigned kRapidFlags = rapidjson::kParseNumbersAsStringsFlag;

enum class RapidOutcome { accepted, handler_stopped, undecided };

/// Runs `sax` over `text` with RapidJSON. `handler_stopped`: the handler returned
/// false on its own; `undecided`: RapidJSON failed or stopped early (e.g. at a NUL),
/// so nlohmann has to parse the text again.
template <class Sax>
RapidOutcome rapid_parse(std::string_view text, Sax& sax) {
  RapidToNlohmann<Sax> adapter(sax);
  rapidjson::MemoryStream stream(text.data(), text.size());
  rapidjson::Reader reader;
  const rapidjson::ParseResult result = reader.Parse<kRapidFlags>(stream, adapter);
  if (result) {
    // RapidJSON reads a NUL byte as the end of input; the whole text must be consumed.
    return stream.Tell() == text.size() ? RapidOutcome::accepted : RapidOutcome::undecided;
  }
  if (result.Code() == rapidjson::kParseErrorTermination && !adapter.needs_second_opinion())
    return RapidOutcome::handler_stopped;
  return RapidOutcome::undecided;
}

}  // namespace machina::detail
