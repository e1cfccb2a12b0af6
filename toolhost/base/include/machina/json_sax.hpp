// The shape the RapidJSON SAX handlers share (JSON-RPC messages and their members, tool
// answers, NDJSON responses): a depth counted against kMaxJsonDepth, keys looked up in a
// constexpr table, the raw text of a value cut out of the input by the stream's position,
// and a failure kept with its reason; and the parse that runs one over a text. CRTP: the
// reader calls the handler's own functions, with no virtual call on the parse's path.
#pragma once

#include <machina/json_text.hpp>

#include <rapidjson/memorystream.h>
#include <rapidjson/reader.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace machina {

/// A key of a JSON object and the field it names.
template <class Field>
struct FieldKey {
  std::string_view key;
  Field field;
};

/// The field `key` names in `table`, or `none` when it names none.
template <class Field, std::size_t N>
constexpr Field field_of(std::string_view key, const FieldKey<Field> (&table)[N], Field none) {
  for (const FieldKey<Field>& entry : table) {
    if (entry.key == key) return entry.field;
  }
  return none;
}

/// "nesting deeper than N": the reason a text past kMaxJsonDepth is refused.
inline std::string nesting_too_deep_text() {
  return "nesting deeper than " + std::to_string(kMaxJsonDepth);
}

/// The base of a RapidJSON handler (`Derived`) reading `Stream`. The derived handler
/// defines the events it cares about (Null, Bool, RawNumber, String, Key, StartObject,
/// EndObject, StartArray, EndArray); the typed number events default to stopping the parse,
/// since handlers parse with numbers as text (kParseNumbersAsStringsFlag) unless they
/// define those events themselves.
template <class Derived, class Stream = rapidjson::MemoryStream>
class JsonSax {
 public:
  bool Int(int) { return false; }
  bool Uint(unsigned) { return false; }
  bool Int64(std::int64_t) { return false; }
  bool Uint64(std::uint64_t) { return false; }
  bool Double(double) { return false; }

  /// Whether the handler stopped the parse with a reason (fail()); why() is that reason.
  bool failed() const { return !why_.empty(); }
  const std::string& why() const { return why_; }
  /// Whether the parse stopped at the depth limit (room_for_one_more()).
  bool too_deep() const { return too_deep_; }

 protected:
  JsonSax(const Stream& stream, std::string_view text) : stream_(stream), text_(text) {}

  /// Whether a container may open at the current depth: false past kMaxJsonDepth, with
  /// too_deep() set (the parse recurses, so a deeper text is refused, not followed). The
  /// handler counts depth_ itself, after its own checks.
  bool room_for_one_more() {
    if (static_cast<std::size_t>(depth_) < kMaxJsonDepth) return true;
    too_deep_ = true;
    return false;
  }
  /// Stops the parse, keeping `why`.
  bool fail(std::string why) {
    why_ = std::move(why);
    return false;
  }
  /// The stream's position: just past the last token read (exact in every event: the
  /// reader works on the stream itself, not on a copy of it).
  std::size_t position() const { return stream_.Tell(); }
  /// The text of the value that began after `from` (a key's end: the colon and blanks
  /// between are skipped) and ends at the position.
  std::string_view raw_since(std::size_t from) const {
    std::size_t at = from;
    while (at < text_.size() &&
           (text_[at] == ':' || text_[at] == ' ' || text_[at] == '\t' || text_[at] == '\n' || text_[at] == '\r'))
      ++at;
    return text_.substr(at, position() - at);
  }
  std::string_view text() const { return text_; }

  int depth_ = 0;  // containers open around the current event (1: inside the top-level one)

 private:
  const Stream& stream_;
  std::string_view text_;
  std::string why_;
  bool too_deep_ = false;
};

/// Runs `sax` (made with `stream`) over the stream with RapidJSON's `Flags`: true when the
/// text parses and the handler's finish(why) takes it. When the parse fails, `why` is the
/// handler's reason if it stopped the parse, else `not_json(result)`.
template <unsigned Flags, class Sax, class Stream, class NotJson>
bool parse_fields(Stream& stream, Sax& sax, std::string& why, NotJson&& not_json) {
  rapidjson::Reader reader;
  const rapidjson::ParseResult result = reader.Parse<Flags>(stream, sax);
  if (!result) {
    why = sax.failed() ? sax.why() : not_json(result);
    return false;
  }
  return sax.finish(why);
}

}  // namespace machina
