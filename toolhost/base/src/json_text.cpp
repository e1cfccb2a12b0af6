// JSON validation by SAX (no DOM) and string escaping; see json_text.hpp.
#include <machina/json_text.hpp>
#include <machina/rapid_sax.hpp>

#include <nlohmann/json.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace machina {
namespace {

/// Accepts every event, only counting depth, so validation costs one lexer pass.
class ValidatingSax {
 public:
  using json = nlohmann::json;
  static constexpr bool kIgnoresText = true;
  explicit ValidatingSax(std::size_t max_depth) : max_depth_(max_depth) {}

  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const json::string_t&) { return true; }
  bool string(json::string_t&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool start_object(std::size_t) { return enter(); }
  bool key(json::string_t&) { return true; }
  bool end_object() {
    --depth_;
    return true;
  }
  bool start_array(std::size_t) { return enter(); }
  bool end_array() {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) {
    position_ = position;
    reason_ = e.what();
    return false;
  }

  bool too_deep() const { return too_deep_; }
  std::size_t position() const { return position_; }
  const std::string& reason() const { return reason_; }

 private:
  bool enter() {
    if (++depth_ > max_depth_) {
      too_deep_ = true;
      return false;
    }
    return true;
  }
  std::size_t max_depth_;
  std::size_t depth_ = 0;
  bool too_deep_ = false;
  std::size_t position_ = 0;
  std::string reason_;
};

}  // namespace

std::string describe_parse_error(std::size_t position, const std::string& what) {
  // nlohmann: "[json.exception.parse_error.101] parse error at line 1, column 2: <why>;
  // last read: '<raw bytes>'". Keep <why> only: the raw bytes may not be UTF-8.
  // Other failures ("[json.exception.out_of_range.406] number overflow parsing '1e400'")
  // keep their text without the library's id.
  std::string why = what;
  if (why.starts_with("[json.exception.")) {
    if (auto close = why.find("] "); close != std::string::npos) why = why.substr(close + 2);
  }
  if (why.starts_with("parse error")) {
    if (auto colon = why.find(": "); colon != std::string::npos) why = why.substr(colon + 2);
  }
  if (auto cut = why.find("; last read"); cut != std::string::npos) why.resize(cut);
  return "invalid JSON at byte " + std::to_string(position) + ": " + why;
}

std::string reject_raw_bytes(std::string_view text) {
  if (const void* nul = std::memchr(text.data(), '\0', text.size())) {
    const auto at = static_cast<std::size_t>(static_cast<const char*>(nul) - text.data()) + 1;
    return "invalid JSON at byte " + std::to_string(at) + ": NUL byte";
  }
  if (text.starts_with("\xEF\xBB\xBF")) return "invalid JSON at byte 1: byte order mark";
  return {};
}

namespace {
bool validate(std::string_view text, std::string* why, std::size_t max_depth, bool nul_terminated) {
  if (std::string bad = reject_raw_bytes(text); !bad.empty()) {
    if (why) *why = std::move(bad);
    return false;
  }
  {
    ValidatingSax fast(max_depth);
    if (detail::rapid_parse(text, fast, nul_terminated) == detail::RapidOutcome::accepted) return true;
  }
  return detail::validate_json_reference(text, why, max_depth);
}
}  // namespace

bool detail::validate_json_reference(std::string_view text, std::string* why, std::size_t max_depth) {
  if (std::string bad = reject_raw_bytes(text); !bad.empty()) {
    if (why) *why = std::move(bad);
    return false;
  }
  ValidatingSax sax(max_depth);
  const char* begin = text.data();
  if (nlohmann::json::sax_parse(begin, begin + text.size(), &sax)) return true;
  if (why) {
    *why = sax.too_deep() ? "nesting deeper than " + std::to_string(max_depth)
                          : describe_parse_error(sax.position(), sax.reason());
  }
  return false;
}

bool validate_json(std::string_view text, std::string* why, std::size_t max_depth) {
  return validate(text, why, max_depth, false);
}

bool validate_json(const std::string& text, std::string* why, std::size_t max_depth) {
  return validate(text, why, max_depth, true);
}

namespace {
// Length of the well-formed UTF-8 sequence at p (RFC 3629), 0 if ill-formed.
std::size_t utf8_sequence_length(const unsigned char* p, const unsigned char* end) noexcept {
  const unsigned char c = *p;
  if (c < 0x80) return 1;
  std::size_t n;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF)
    n = 2;
  else if (c == 0xE0) {
    n = 3;
    lo = 0xA0;
  } else if (c >= 0xE1 && c <= 0xEC)
    n = 3;
  else if (c == 0xED) {
    n = 3;
    hi = 0x9F;
  } else if (c >= 0xEE && c <= 0xEF)
    n = 3;
  else if (c == 0xF0) {
    n = 4;
    lo = 0x90;
  } else if (c >= 0xF1 && c <= 0xF3)
    n = 4;
  else if (c == 0xF4) {
    n = 4;
    hi = 0x8F;
  } else
    return 0;
  if (static_cast<std::size_t>(end - p) < n) return 0;
  if (p[1] < lo || p[1] > hi) return 0;
  for (std::size_t i = 2; i < n; ++i) {
    if (p[i] < 0x80 || p[i] > 0xBF) return 0;
  }
  return n;
}
}  // namespace

// Eight bytes at a time ("SWAR"): masks with the high bit set in each byte of `w` that
// is >= 0x80, < 0x20, or equal to '"' or '\\'.
constexpr std::uint64_t kOnes = 0x0101010101010101ULL;
constexpr std::uint64_t kHighs = 0x8080808080808080ULL;
inline std::uint64_t load8(const unsigned char* p) {
  std::uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}
inline std::uint64_t bytes_equal(std::uint64_t w, unsigned char c) {
  const std::uint64_t x = w ^ (kOnes * c);
  return (x - kOnes) & ~x & kHighs;
}
inline std::uint64_t bytes_below(std::uint64_t w, unsigned char c) {
  return (w - kOnes * c) & ~w & kHighs;
}

namespace {
template <bool kNoControls>
bool check_utf8(std::string_view s) noexcept {
  auto p = reinterpret_cast<const unsigned char*>(s.data());
  const auto end = p + s.size();
  auto plain_ascii = [](std::uint64_t w) { return (w & kHighs) == 0 && (!kNoControls || bytes_below(w, 0x20) == 0); };
  while (p != end) {
    while (end - p >= 8) {  // ASCII runs
      if (!plain_ascii(load8(p))) break;
      p += 8;
    }
    // A tail shorter than eight bytes: the text's last eight, read as one word, settle it
    // when they are plain ASCII (p is always at the start of a character).
    if (end - p < 8 && s.size() >= 8 && plain_ascii(load8(end - 8))) return true;
    while (p != end && *p < 0x80) {
      if (kNoControls && *p < 0x20) return false;
      ++p;
    }
    if (p == end) break;
    const std::size_t n = utf8_sequence_length(p, end);
    if (n == 0) return false;
    p += n;
  }
  return true;
}
}  // namespace

bool is_valid_utf8(std::string_view s) noexcept {
  return check_utf8<false>(s);
}

bool detail::is_utf8_without_controls(std::string_view s) noexcept {
  return check_utf8<true>(s);
}

bool detail::number_fits_double(std::string_view text) {
  if (text.size() <= 300 && text.find_first_of("eE") == std::string_view::npos) return true;
  return std::isfinite(std::strtod(std::string(text).c_str(), nullptr));
}

std::string to_valid_utf8(std::string_view s) {
  if (is_valid_utf8(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  auto p = reinterpret_cast<const unsigned char*>(s.data());
  const auto end = p + s.size();
  while (p != end) {
    const std::size_t n = utf8_sequence_length(p, end);
    if (n == 0) {
      out.append("\xEF\xBF\xBD");
      ++p;
    } else {
      out.append(reinterpret_cast<const char*>(p), n);
      p += n;
    }
  }
  return out;
}

void append_json_string(std::string& out, std::string_view s) {
  if (s.empty()) {  // the error of every success
    out.append("\"\"", 2);
    return;
  }
  // Written through a pointer into room made up front: the quotes, the text as it is,
  // and kSlack more. Plain runs are copied sixteen (or eight) bytes at a time, blindly
  // into that room; only the bytes written count. A string with many escapes gets more
  // room as they come.
  static constexpr char kHex[] = "0123456789abcdef";
  static constexpr std::size_t kSlack = 64;
  const std::size_t start = out.size();
  out.resize(start + s.size() + 2 + kSlack);
  char* d = out.data() + start;
  char* room_end = out.data() + out.size();
  *d++ = '"';
  const char* p = s.data();
  const char* end = p + s.size();
  for (;;) {
    // Room for a blind 16-byte copy and an escape, beyond the rest as it is.
    if (static_cast<std::size_t>(room_end - d) < static_cast<std::size_t>(end - p) + 24) {
      const std::size_t at = static_cast<std::size_t>(d - out.data());
      out.resize(out.size() + static_cast<std::size_t>(end - p) + kSlack);
      d = out.data() + at;
      room_end = out.data() + out.size();
    }
    std::size_t plain = 0;  // bytes before the next one to escape, within the block read
    bool found = false;
#if defined(__SSE2__)
    if (end - p >= 16) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d), v);
      const unsigned mask = detail::json_string_stops(v);
      found = mask != 0;
      plain = found ? static_cast<std::size_t>(__builtin_ctz(mask)) : 16;
    } else
#endif
        if (end - p >= 8) {
      const std::uint64_t w = load8(reinterpret_cast<const unsigned char*>(p));
      std::memcpy(d, p, 8);
      const std::uint64_t mask = bytes_below(w, 0x20) | bytes_equal(w, '"') | bytes_equal(w, '\\');
      found = mask != 0;
      // The lowest flagged byte is exact (borrows only run upward), and on a little-endian
      // machine it is the first in memory.
      static_assert(std::endian::native == std::endian::little, "the SWAR scan counts bytes from the low end");
      plain = found ? static_cast<std::size_t>(__builtin_ctzll(mask) / 8) : 8;
    } else {
      while (p + plain != end) {
        const auto c = static_cast<unsigned char>(p[plain]);
        if (c < 0x20 || c == '"' || c == '\\') {
          found = true;
          break;
        }
        d[plain] = static_cast<char>(c);
        ++plain;
      }
    }
    p += plain;
    d += plain;
    if (!found) {
      if (p == end) break;
      continue;
    }
    const auto c = static_cast<unsigned char>(*p++);
    d[0] = '\\';
    switch (c) {
      case '"':
        d[1] = '"';
        d += 2;
        break;
      case '\\':
        d[1] = '\\';
        d += 2;
        break;
      case '\n':
        d[1] = 'n';
        d += 2;
        break;
      case '\r':
        d[1] = 'r';
        d += 2;
        break;
      case '\t':
        d[1] = 't';
        d += 2;
        break;
      case '\b':
        d[1] = 'b';
        d += 2;
        break;
      case '\f':
        d[1] = 'f';
        d += 2;
        break;
      default:
        d[1] = 'u';
        d[2] = '0';
        d[3] = '0';
        d[4] = kHex[c >> 4];
        d[5] = kHex[c & 15];
        d += 6;
    }
    if (p == end) break;
  }
  *d++ = '"';
  out.resize(static_cast<std::size_t>(d - out.data()));
}

bool starts_json_object(std::string_view text) noexcept {
  const auto at = text.find_first_not_of(" \t\r\n");
  return at != std::string_view::npos && text[at] == '{';
}

std::string excerpt(std::string_view s) {
  std::size_t chars = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) continue;  // a continuation byte
    if (chars++ == kMaxEchoChars) {
      return std::string(s.substr(0, i)) + "\u2026 (" + std::to_string(s.size()) + " bytes)";
    }
  }
  return std::string(s);
}

}  // namespace machina
