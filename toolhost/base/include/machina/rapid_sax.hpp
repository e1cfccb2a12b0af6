// Fast path for JSON parsing: RapidJSON's SAX reader feeding handlers written against
// nlohmann's SAX interface. RapidJSON only ever *accepts*: on any failure the caller
// parses again with nlohmann, which decides and explains, so both paths accept exactly
// the same documents and every error message comes from one place.
#pragma once

#include <machina/json_text.hpp>

// x86-64 always has SSE2: RapidJSON then skips whitespace and copies strings 16 bytes
// at a time. Those are aligned loads that may read past the end of the text within its
// 16-byte block (never across a page, so harmless), which AddressSanitizer reports:
// sanitizer builds use the plain scanner.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MACHINA_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define MACHINA_ASAN 1
#endif
#if defined(__SSE2__) && !defined(RAPIDJSON_SSE2) && !defined(MACHINA_ASAN)
#define RAPIDJSON_SSE2
#endif
#include <rapidjson/memorystream.h>
#include <rapidjson/reader.h>
#include <rapidjson/stream.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace machina::detail {
/// Bytes a text parsed in place by scan_json_string must have readable after its
/// terminating NUL.
inline constexpr std::size_t kScanPadding = 16;

#if defined(__SSE2__)
/// The bytes of `v` a JSON string cannot hold as they are ('"', '\\' and those below 0x20),
/// as a mask: bit i for byte i.
inline unsigned json_string_stops(__m128i v) noexcept {
  const __m128i control = _mm_set1_epi8(0x1F);
  const __m128i quote_or_backslash =
      _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('"')), _mm_cmpeq_epi8(v, _mm_set1_epi8('\\')));
  const __m128i below_0x20 = _mm_cmpeq_epi8(_mm_max_epu8(v, control), control);  // v <= 0x1F
  const __m128i stops = _mm_or_si128(quote_or_backslash, below_0x20);
  return static_cast<unsigned>(_mm_movemask_epi8(stops));
}

/// RapidJSON's hook for reading a string in place (ScanCopyUnescapedString), for texts in a
/// buffer of ours with kScanPadding readable bytes after their NUL: moves `src` to the
/// first '"', '\\' or byte below 0x20 of the string it is in (the NUL is one), 16 bytes at
/// a time from wherever the string starts (RapidJSON's own scanner goes byte by byte up to
/// a 16-byte boundary, which is most of a short string such as a key or a field name), and
/// moves the bytes before it down to `dst` behind an earlier escape (dst != src). If
/// `plain_end` is given and the string has been printable ASCII without an escape up to a
/// stop, that stop's place is stored there (a closing quote, if the string ends there).
inline void scan_json_string(char*& src, char*& dst, const char** plain_end) noexcept {
  char* p = src;
  char* q = dst;
  const bool unescaped = p == q;  // no escape yet in this string (an escape puts dst behind src)
  unsigned high = 0;              // bytes of 0x80 and above, seen so far
  for (;;) {
    const __m128i s = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const unsigned mask = json_string_stops(s);
    if (mask != 0) {
      const auto n = static_cast<std::size_t>(__builtin_ctz(mask));
      high |= static_cast<unsigned>(_mm_movemask_epi8(s)) & ((1u << n) - 1);
      if (plain_end != nullptr && unescaped && high == 0) *plain_end = p + n;
      if (p != q) {  // the n bytes before the stop move down, taken from `s` (a wider store could
                     // overwrite the stop itself)
        auto word = static_cast<std::uint64_t>(_mm_cvtsi128_si64(s));
        char* d = q;
        if (n & 8) {
          std::memcpy(d, &word, 8);
          d += 8;
          word = static_cast<std::uint64_t>(_mm_cvtsi128_si64(_mm_unpackhi_epi64(s, s)));
        }
        if (n & 4) {
          std::memcpy(d, &word, 4);
          d += 4;
          word >>= 32;
        }
        if (n & 2) {
          std::memcpy(d, &word, 2);
          d += 2;
          word >>= 16;
        }
        if (n & 1) *d = static_cast<char>(word);
      }
      src = p + n;
      dst = q + n;
      return;
    }
    // Sixteen bytes without a stop: behind an escape they move down (q < p; all sixteen are in `s`).
    high |= static_cast<unsigned>(_mm_movemask_epi8(s));
    if (p != q) _mm_storeu_si128(reinterpret_cast<__m128i*>(q), s);
    p += 16;
    q += 16;
  }
}
#endif

/// A text parsed in place in a buffer of ours, with kScanPadding readable bytes after its
/// NUL, so that strings are read by scan_json_string.
struct PaddedInsituStream : rapidjson::InsituStringStream {
  PaddedInsituStream(char* text, const char** plain_end_slot)
      : rapidjson::InsituStringStream(text), plain_end(plain_end_slot) {}
  /// Where the scanner records the end (the closing quote) of the last string it found
  /// plain: printable ASCII without an escape, so its text needs no UTF-8 or control
  /// check. Kept outside the stream, which RapidJSON copies while it reads a string.
  const char** plain_end;
};
}  // namespace machina::detail

RAPIDJSON_NAMESPACE_BEGIN
template <>
struct StreamTraits<machina::detail::PaddedInsituStream> {
  enum { copyOptimization = 1 };
};
/// Whitespace between tokens is mostly none or one space: a plain loop on the pointer.
template <>
inline void SkipWhitespace(machina::detail::PaddedInsituStream& is) {
  char* p = is.src_;
  while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') ++p;
  is.src_ = p;
}
#if defined(__SSE2__)
template <>
template <>
inline void GenericReader<UTF8<>, UTF8<>, CrtAllocator>::ScanCopyUnescapedString(
    machina::detail::PaddedInsituStream& is, machina::detail::PaddedInsituStream&) {
  machina::detail::scan_json_string(is.src_, is.dst_, is.plain_end);
}
#endif
RAPIDJSON_NAMESPACE_END

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
    if (std::memchr(s, '.', n) == nullptr && std::memchr(s, 'e', n) == nullptr && std::memchr(s, 'E', n) == nullptr) {
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
    if (!number_fits_double(std::string_view(s, n))) {
      undecided_ = true;
      return false;
    }
    scratch_.assign(s, n);
    return sax_.number_float(std::strtod(scratch_.c_str(), nullptr), scratch_);
  }
  // Handlers may take text as a string_view (string_view_value / key_view), which
  // saves a copy; a handler declaring `kIgnoresText` gets an empty string.
  bool String(const char* s, rapidjson::SizeType n, bool) {
    if (!text(s, n)) return false;
    if constexpr (requires(std::string_view v) { sax_.string_view_value(v); })
      return sax_.string_view_value(std::string_view(s, n));
    else
      return sax_.string(scratch_);
  }
  bool Key(const char* s, rapidjson::SizeType n, bool) {
    if (!text(s, n)) return false;
    if constexpr (requires(std::string_view v) { sax_.key_view(v); })
      return sax_.key_view(std::string_view(s, n));
    else
      return sax_.key(scratch_);
  }

  static constexpr bool kCopiesText =
      !requires { Sax::kIgnoresText; } && !requires(Sax& x, std::string_view v) { x.string_view_value(v); };
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
  /// Parsed from a PaddedInsituStream: where its scanner records the end of the last
  /// string it found plain (such a string needs no UTF-8 check here).
  void watch_plain_end(const char* const* plain_end) { plain_end_ = plain_end; }

 private:
  // RapidJSON runs without its own encoding check: checking the decoded text is
  // enough (raw bytes pass through; escapes decode to UTF-8, a lone low surrogate
  // escape to an ill-formed sequence) and costs one pass instead of two.
  // Control characters go to nlohmann too: RapidJSON 1.1's SSE2 scanner lets raw bytes
  // 0x1A..0x1F through (its bound is 0x19), and a decoded control character cannot tell
  // a raw byte (invalid) from an escape (valid). Both are rare in real requests.
  bool text(const char* s, std::size_t n) {
    // (a stop the scanner recorded at an escape lies before the end of that string's
    // decoded text, since an escape decodes to at least one byte: it never matches)
    if ((plain_end_ == nullptr || s + n != *plain_end_) && !is_utf8_without_controls(std::string_view(s, n))) {
      undecided_ = true;
      return false;
    }
    if constexpr (kCopiesText) scratch_.assign(s, n);
    return true;
  }

  Sax& sax_;
  std::string scratch_;
  bool undecided_ = false;
  const char* const* plain_end_ = nullptr;  // see watch_plain_end
};

inline constexpr unsigned kRapidFlags = rapidjson::kParseNumbersAsStringsFlag;
/// Texts up to this size are parsed in place in a per-thread copy (larger ones as they are).
inline constexpr std::size_t kInsituMaxBytes = 64 * 1024;

enum class RapidOutcome { accepted, handler_stopped, undecided };

/// Runs `sax` over `text` with RapidJSON. `handler_stopped`: the handler returned
/// false on its own; `undecided`: RapidJSON failed or stopped early (e.g. at a NUL),
/// so nlohmann has to parse the text again. `nul_terminated` (text[size] is readable and
/// '\0') matters only for a text that is not parsed in a copy (longer than
/// kInsituMaxBytes, or a parse nested in another): RapidJSON then reads it without
/// measuring it.
template <class Sax>
RapidOutcome rapid_parse(std::string_view text, Sax& sax, bool nul_terminated = false) {
  RapidToNlohmann<Sax> adapter(sax);
  // One reader per thread: its parse stack is kept between documents, so a request
  // does not pay for allocating it. A handler may parse again while the reader is
  // busy (content_json inside a request); that nested parse gets its own reader.
  thread_local rapidjson::Reader shared_reader;
  thread_local bool shared_busy = false;
  std::optional<rapidjson::Reader> own_reader;
  rapidjson::Reader& reader = shared_busy ? own_reader.emplace() : shared_reader;
  const bool took_shared = !shared_busy;
  shared_busy = true;
  struct Release {
    bool active;
    ~Release() {
      if (active) shared_busy = false;
    }
  } release{took_shared};
  rapidjson::ParseResult result;
  std::size_t consumed = 0;
  if (took_shared && text.size() <= kInsituMaxBytes) {
    // Parsed in place in a padded copy: strings are then scanned 16 bytes at a time, not
    // copied character by character into the reader's stack. The text itself stays as it
    // was, for nlohmann to explain a failure.
    thread_local std::vector<char> insitu;
    const std::size_t room = text.size() + 1 + kScanPadding;
    if (insitu.size() < room) insitu.resize(room);
    if (!text.empty()) std::memcpy(insitu.data(), text.data(), text.size());
    insitu[text.size()] = '\0';
    const char* plain_end = nullptr;
    PaddedInsituStream stream(insitu.data(), &plain_end);
    adapter.watch_plain_end(&plain_end);
    result = reader.Parse<kRapidFlags | rapidjson::kParseInsituFlag>(stream, adapter);
    consumed = stream.Tell();
  } else if (nul_terminated) {
    rapidjson::StringStream stream(text.data());
    result = reader.Parse<kRapidFlags>(stream, adapter);
    consumed = stream.Tell();
  } else {
    rapidjson::MemoryStream stream(text.data(), text.size());
    result = reader.Parse<kRapidFlags>(stream, adapter);
    consumed = stream.Tell();
  }
  if (result) {
    // RapidJSON reads a NUL byte as the end of input; the whole text must be consumed.
    return consumed == text.size() ? RapidOutcome::accepted : RapidOutcome::undecided;
  }
  if (result.Code() == rapidjson::kParseErrorTermination && !adapter.needs_second_opinion())
    return RapidOutcome::handler_stopped;
  return RapidOutcome::undecided;
}

}  // namespace machina::detail
