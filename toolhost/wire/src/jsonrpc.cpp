// See jsonrpc.hpp.
#include <machina/json_sax.hpp>
#include <machina/json_text.hpp>
#include <machina/jsonrpc.hpp>
#include <machina/rapid_sax.hpp>

#include <rapidjson/error/en.h>
#include <rapidjson/reader.h>

#include <charconv>
#include <memory>

namespace machina::jsonrpc {
namespace {

/// A NUL-terminated copy of the text, read in place: strings are decoded where they stand
/// instead of being copied character by character onto the reader's stack (a quarter of
/// a --mcp call went there), and Tell() is right in every callback — the reader works on
/// this stream itself, not on a local copy as it does for its own string streams (whose
/// position is stale inside a string's callback), so raw text can be cut by position.
/// (With numbers as strings the reader hands RawNumber the position *after* the number on
/// such a stream: the handlers below take the text from `end - length`.)
class LineStream {
 public:
  using Ch = char;
  explicit LineStream(char* text) : begin_(text), src_(text) {}
  Ch Peek() const { return *src_; }
  Ch Take() { return *src_++; }
  std::size_t Tell() const { return static_cast<std::size_t>(src_ - begin_); }
  Ch* PutBegin() { return dst_ = src_; }
#if defined(__SSE2__)
  /// RapidJSON's in-place string scan (the copy is padded: see Scratch).
  void scan_string() { detail::scan_json_string(src_, dst_, nullptr); }
#endif
  void Put(Ch c) { *dst_++ = c; }
  std::size_t PutEnd(Ch* begin) { return static_cast<std::size_t>(dst_ - begin); }
  void Flush() {}

 private:
  char* begin_;
  char* src_;
  char* dst_ = nullptr;
};

static_assert(rapidjson::StreamTraits<LineStream>::copyOptimization == 0,
              "the reader must work on the LineStream itself: Tell() in callbacks, RawNumber's text");

}  // namespace
}  // namespace machina::jsonrpc

#if defined(__SSE2__)
template <>
template <>
inline void rapidjson::GenericReader<rapidjson::UTF8<>, rapidjson::UTF8<>,
                                     rapidjson::CrtAllocator>::ScanCopyUnescapedString(machina::jsonrpc::LineStream& is,
                                                                                       machina::jsonrpc::LineStream&) {
  is.scan_string();
}
#endif

namespace machina::jsonrpc {
namespace {

/// What one parse works with: a reader (its stack allocated once per thread, not per line)
/// and the copy its stream reads. A parse that starts while the thread's are busy (a
/// handler parsing inside another parse) gets its own.
class Scratch {
 public:
  explicit Scratch(std::string_view text) {
    thread_local Parts shared;
    if (!shared.busy) {
      shared.busy = true;
      shared_ = &shared;
      parts_ = &shared;
    } else {
      own_ = std::make_unique<Parts>();
      parts_ = own_.get();
    }
    // NUL-terminated, and padded for the string scanner (std::string keeps a NUL after
    // its last character, and the padding is more of them).
    parts_->copy.assign(text);
    parts_->copy.append(detail::kScanPadding, '\0');
  }
  ~Scratch() {
    if (shared_ == nullptr) return;
    // A copy of a very long line (past 4 MiB) is not kept for the thread's later, short ones.
    if (shared_->copy.capacity() > kKeepBytes) shared_->copy = std::string();
    shared_->busy = false;
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  char* text() { return parts_->copy.data(); }
  template <class Sax>
  rapidjson::ParseResult parse(LineStream& stream, Sax& sax) {
    constexpr unsigned kFlags =
        rapidjson::kParseInsituFlag | rapidjson::kParseNumbersAsStringsFlag | rapidjson::kParseStopWhenDoneFlag;
    return parts_->reader.Parse<kFlags>(stream, sax);
  }

 private:
  static constexpr std::size_t kKeepBytes = 4u << 20;
  struct Parts {
    rapidjson::Reader reader;
    std::string copy;
    bool busy = false;
  };
  Parts* parts_ = nullptr;
  Parts* shared_ = nullptr;
  std::unique_ptr<Parts> own_;
};

/// Reads the members of one message; the raw text of id, params, result and error.data is
/// cut out of the line by the stream's positions.
class MessageSax : public JsonSax<MessageSax, LineStream> {
 public:
  MessageSax(Message& out, const LineStream& stream, std::string_view text) : JsonSax(stream, text), out_(out) {}

  bool Null() { return param(Member::Type::null, {}) && scalar(Type::null); }
  bool Bool(bool) { return param(Member::Type::boolean, {}) && scalar(Type::other); }
  bool RawNumber(const char* after, rapidjson::SizeType n, bool) {
    const char* s = after - n;  // (see LineStream)
    param(Member::Type::number, {});
    // A number nlohmann refuses leaves params to the host's own check.
    if (in_params() && !params_doubt_) params_doubt_ = !detail::number_fits_double(std::string_view(s, n));
    if (depth_ == 2 && field_ == Field::error && error_field_ == ErrorField::code) {
      int code = 0;
      const auto [end, ec] = std::from_chars(s, s + n, code);
      if (ec == std::errc() && end == s + n) {
        out_.error_code = code;
        saw_code_ = true;
      }
    }
    return scalar(Type::number);
  }
  bool String(const char* s, rapidjson::SizeType n, bool) {
    param(Member::Type::string, std::string_view(s, n));
    doubt_unless_plain(std::string_view(s, n));
    if (depth_ == 1) {
      if (field_ == Field::jsonrpc)
        version_ok_ = std::string_view(s, n) == "2.0";
      else if (field_ == Field::method)
        out_.method.assign(s, n), saw_method_ = true;
    } else if (depth_ == 2 && field_ == Field::error && error_field_ == ErrorField::message) {
      out_.error_message.assign(s, n);
      saw_message_ = true;
    }
    return scalar(Type::string);
  }
  bool Key(const char* s, rapidjson::SizeType n, bool) {
    const std::string_view k(s, n);
    if (depth_ > 1) doubt_unless_plain(k);
    if (depth_ == 1) {
      start1_ = position();
      field_ = field_of(k, kFields, Field::other);
      if (field_ == Field::params) params_doubt_ = false;  // (given twice, the last params counts)
      if (field_ != Field::other) seen(seen1_, static_cast<unsigned>(field_), k);
    } else if (depth_ == 2 && field_ == Field::params) {
      start2_ = position();
      if (params_object_ && out_.params_member_count < Message::kParamsMembers) {
        out_.params_members[out_.params_member_count].key.assign(s, n);
      } else {
        params_overflow_ = true;
      }
    } else if (depth_ == 2 && field_ == Field::error) {
      start2_ = position();
      error_field_ = field_of(k, kErrorFields, ErrorField::other);
      if (error_field_ != ErrorField::other)
        seen(seen2_, static_cast<unsigned>(error_field_), "error." + std::string(k));
    }
    return true;
  }
  bool StartObject() { return start(true); }
  bool EndObject(rapidjson::SizeType) { return end(); }
  bool StartArray() { return start(false); }
  bool EndArray(rapidjson::SizeType) { return end(); }

  void finish() {
    if (batch_) return invalid("a batch (JSON-RPC arrays are not supported here)");
    if (!object_) return invalid("not a JSON-RPC message (not an object)");
    if (!twice_.empty()) {
      // Read as either of its values, a member given twice would let two readers of one
      // message disagree (a proxy checks one id or method, this host answers the other).
      if (twice_ == "id") out_.id = {};
      return invalid("the member \"" + twice_ + "\" is given twice");
    }
    if (!version_ok_) return invalid("not a JSON-RPC 2.0 message (\"jsonrpc\": \"2.0\" missing)");
    if (id_type_ != Type::none && id_type_ != Type::number && id_type_ != Type::string && id_type_ != Type::null)
      return invalid("the id must be a number or a string");
    if (saw_method_) {
      if (!saw_result_ && !saw_error_) {
        if (id_type_ == Type::none)
          out_.kind = Message::Kind::notification;
        else if (id_type_ == Type::null)
          return invalid("a request's id must not be null");
        else
          out_.kind = Message::Kind::request;
        if (params_type_ != Type::none && params_type_ != Type::object && params_type_ != Type::array)
          return invalid("params must be an object or an array");
        return;
      }
      return invalid("a message with a method has no result or error");
    }
    if (saw_result_ && !saw_error_ && id_type_ != Type::none) {
      out_.kind = Message::Kind::result;
      return;
    }
    if (saw_error_ && !saw_result_ && id_type_ != Type::none) {
      if (!saw_code_ || !saw_message_) return invalid("an error needs an integer code and a message");
      out_.kind = Message::Kind::error;
      return;
    }
    invalid("neither a request, a notification, a result nor an error");
  }

 private:
  enum class Field { jsonrpc, id, method, params, result, error, other };
  enum class ErrorField { code, message, data, other };
  enum class Type { none, null, number, string, object, array, other };
  static constexpr FieldKey<Field> kFields[] = {{"jsonrpc", Field::jsonrpc}, {"id", Field::id},
                                                {"method", Field::method},   {"params", Field::params},
                                                {"result", Field::result},   {"error", Field::error}};
  static constexpr FieldKey<ErrorField> kErrorFields[] = {
      {"code", ErrorField::code}, {"message", ErrorField::message}, {"data", ErrorField::data}};

  void invalid(std::string why) {
    out_.kind = Message::Kind::invalid;
    out_.why = std::move(why);
  }
  /// A member of the envelope (or of its error) met: the first one met twice is kept.
  void seen(unsigned& mask, unsigned bit, std::string_view key) {
    if ((mask & (1u << bit)) != 0 && twice_.empty()) twice_ = key;
    mask |= 1u << bit;
  }
  /// A value ended here: at depth 1 (a member of the message) or 2 (of its error).
  void ended(Type type) {
    if (depth_ == 1) {
      switch (field_) {
        case Field::id:
          out_.id = raw_since(start1_);
          id_type_ = type;
          break;
        case Field::params:
          out_.params = raw_since(start1_);
          out_.params_valid_json = !params_doubt_;
          params_type_ = type;
          out_.params_members_found = type == Type::object && params_object_ && !params_overflow_;
          if (!out_.params_members_found) out_.params_member_count = 0;
          break;
        case Field::result:
          out_.result = raw_since(start1_);
          saw_result_ = true;
          break;
        case Field::error: saw_error_ = type == Type::object; break;
        default: break;
      }
    } else if (depth_ == 2 && field_ == Field::error && error_field_ == ErrorField::data) {
      out_.error_data = raw_since(start2_);
    }
  }
  bool scalar(Type type) {
    if (depth_ == 0) return true;  // (a bare value: not an object; see finish)
    ended(type);
    return true;
  }
  bool start(bool object) {
    if (!room_for_one_more()) return false;
    if (depth_ == 0) {
      if (object)
        object_ = true;
      else
        batch_ = true;
    } else if (depth_ == 1 && field_ == Field::params) {
      // (A params given twice makes the message invalid; its members start again here so
      // that the second stays within params_members.)
      params_object_ = object;
      params_overflow_ = false;
      out_.params_member_count = 0;
    }
    ++depth_;
    return true;
  }
  /// Whether the event is params' value or within it.
  bool in_params() const { return depth_ >= 1 && field_ == Field::params; }
  /// Within params, a string or key validate_json would not take as it is (ill-formed
  /// UTF-8, or a control character — raw ones are refused by the parse, escaped ones are
  /// valid but left to the host to judge) leaves params to the host's own check.
  void doubt_unless_plain(std::string_view text) {
    if (in_params() && !params_doubt_ && !detail::is_utf8_without_controls(text)) params_doubt_ = true;
  }
  /// A value began at depth 2 inside an object `params`: a scalar member (containers end
  /// in end()).
  bool param(Member::Type type, std::string_view decoded) {
    if (depth_ == 2 && field_ == Field::params) add_param(type, decoded);
    return true;
  }
  void add_param(Member::Type type, std::string_view decoded) {
    if (!params_object_ || params_overflow_) return;
    auto& m = out_.params_members[out_.params_member_count++];
    m.raw = raw_since(start2_);
    m.type = type;
    if (type == Member::Type::string) m.string.assign(decoded);
  }
  bool end() {
    --depth_;
    // The container that just closed was a member's value (depth 1) or error.data (2).
    if (depth_ == 1) {
      const std::string_view value = raw_since(start1_);  // an object or an array: its first character says
      ended(!value.empty() && value.front() == '{' ? Type::object : Type::array);
    } else if (depth_ == 2) {
      if (field_ == Field::params) {
        const std::string_view value = raw_since(start2_);
        add_param(!value.empty() && value.front() == '{' ? Member::Type::object : Member::Type::array, {});
      }
      ended(Type::other);
    }
    return true;
  }

  Message& out_;
  Field field_ = Field::other;
  ErrorField error_field_ = ErrorField::other;
  std::size_t start1_ = 0, start2_ = 0;
  bool object_ = false, batch_ = false, version_ok_ = false, saw_method_ = false, saw_result_ = false,
       saw_error_ = false, saw_code_ = false, saw_message_ = false;
  Type id_type_ = Type::none, params_type_ = Type::none;
  bool params_object_ = false, params_overflow_ = false;
  bool params_doubt_ = false;       // see Message::params_valid_json
  unsigned seen1_ = 0, seen2_ = 0;  // the envelope's members met (by Field), its error's (by ErrorField)
  std::string twice_;               // the first member met twice
};

/// The members of one object, each with its raw text (see for_each_member).
class MemberSax : public JsonSax<MemberSax, LineStream> {
 public:
  MemberSax(const LineStream& stream, std::string_view text, const std::function<bool(const Member&)>& each)
      : JsonSax(stream, text), each_(each) {}

  bool Null() { return scalar(Member::Type::null, {}); }
  bool Bool(bool) { return scalar(Member::Type::boolean, {}); }
  bool RawNumber(const char*, rapidjson::SizeType, bool) { return scalar(Member::Type::number, {}); }
  bool String(const char* s, rapidjson::SizeType n, bool) {
    return scalar(Member::Type::string, std::string_view(s, n));
  }
  bool Key(const char* s, rapidjson::SizeType n, bool) {
    if (depth_ == 1) {
      key_.assign(s, n);
      start_ = position();
    }
    return true;
  }
  bool StartObject() { return start(true); }
  bool EndObject(rapidjson::SizeType) { return end(Member::Type::object); }
  bool StartArray() { return start(false); }
  bool EndArray(rapidjson::SizeType) { return end(Member::Type::array); }
  bool object() const { return object_; }
  bool array() const { return array_; }
  bool stopped() const { return stopped_; }

 private:
  bool start(bool object) {
    if (!room_for_one_more()) return false;
    if (depth_ == 0) {
      object_ = object;
      array_ = !object;
    } else if (depth_ == 1 && array_) {
      start_ = position() - 1;  // (an element: from its opening bracket)
    }
    ++depth_;
    return true;
  }
  bool emit(Member::Type type, std::string_view string) {
    Member m;
    m.key = key_;
    m.raw = raw_since(start_);
    m.type = type;
    m.string = string;
    stopped_ = !each_(m);
    return !stopped_;
  }
  bool scalar(Member::Type type, std::string_view string) {
    if (depth_ != 1) return true;
    if (array_) {  // an element's text: from after the separator before it
      start_ = element_start();
    }
    const bool go_on = emit(type, string);
    last_end_ = position();
    return go_on;
  }
  /// Where the element that just ended began (after the '[' or ',' before it).
  std::size_t element_start() const {
    std::size_t at = last_end_;
    const std::string_view text = this->text();
    while (at < text.size() && (text[at] == '[' || text[at] == ',' || text[at] == ' ' || text[at] == '\t' ||
                                text[at] == '\n' || text[at] == '\r'))
      ++at;
    return at;
  }
  bool end(Member::Type type) {
    --depth_;
    if (depth_ != 1) return true;
    const bool go_on = emit(type, {});
    last_end_ = position();
    return go_on;
  }

  const std::function<bool(const Member&)>& each_;
  std::string key_;
  std::size_t start_ = 0, last_end_ = 0;
  bool object_ = false, array_ = false, stopped_ = false;
};

std::string parse_error_text(const rapidjson::ParseResult& result, bool too_deep) {
  if (too_deep) return nesting_too_deep_text();
  return rapidjson::GetParseError_En(result.Code());
}

/// The members of an object or the elements of an array, as `want` says `text` must be.
enum class Container : bool { object, array };

bool for_each_part(std::string_view text, const std::function<bool(const Member&)>& each, std::string& why,
                   Container want) {
  Scratch scratch(text);
  LineStream stream(scratch.text());
  MemberSax sax(stream, text, each);
  const auto result = scratch.parse(stream, sax);
  if (sax.stopped()) {
    why = "stopped";
    return false;
  }
  if (!result) {
    why = "not JSON (" + parse_error_text(result, sax.too_deep()) + " at byte " + std::to_string(result.Offset()) + ")";
    return false;
  }
  if (want == Container::object ? !sax.object() : !sax.array()) {
    why = want == Container::object ? "not an object" : "not an array";
    return false;
  }
  return true;
}

}  // namespace

bool for_each_member(std::string_view text, const std::function<bool(const Member&)>& each, std::string& why) {
  return for_each_part(text, each, why, Container::object);
}

bool for_each_element(std::string_view text, const std::function<bool(const Member&)>& each, std::string& why) {
  return for_each_part(text, each, why, Container::array);
}

std::string find_id(std::string_view head) {
  std::string id, why;
  for_each_member(
      head,
      [&](const Member& m) {
        if (m.key != "id") return true;
        if (m.type == Member::Type::number || m.type == Member::Type::string) id = std::string(m.raw);
        return false;
      },
      why);
  return id;
}

const char* type_name(Member::Type type) {
  switch (type) {
    case Member::Type::null: return "null";
    case Member::Type::boolean: return "a boolean";
    case Member::Type::number: return "a number";
    case Member::Type::string: return "a string";
    case Member::Type::object: return "an object";
    case Member::Type::array: return "an array";
  }
  return "a value";
}

void Message::clear() {
  kind = Kind::invalid;
  id = {};
  method.clear();
  params = {};
  result = {};
  error_code = 0;
  error_message.clear();
  error_data = {};
  why.clear();
  params_member_count = 0;
  params_members_found = false;
  params_valid_json = false;
}

bool parse(std::string_view line, Message& out, std::string& why) {
  out.clear();
  Scratch scratch(line);
  LineStream stream(scratch.text());
  MessageSax sax(out, stream, line);
  const auto result = scratch.parse(stream, sax);
  if (!result) {
    why = "not JSON (" + parse_error_text(result, sax.too_deep()) + " at byte " + std::to_string(result.Offset()) + ")";
    return false;
  }
  // Only blanks may follow the value.
  for (std::size_t at = stream.Tell(); at < line.size(); ++at) {
    const char c = line[at];
    if (c != ' ' && c != '\t' && c != '\r' && c != '\n') {
      why = "not JSON (text after the value at byte " + std::to_string(at) + ")";
      return false;
    }
  }
  sax.finish();
  return true;
}

void append_request(std::string& out, std::string_view id, std::string_view method, std::string_view params) {
  append_literal(out, "{\"jsonrpc\":\"2.0\",");
  if (!id.empty()) {
    append_literal(out, "\"id\":");
    out.append(id);
    out.push_back(',');
  }
  append_literal(out, "\"method\":");
  append_json_string(out, method);
  if (!params.empty()) {
    append_literal(out, ",\"params\":");
    out.append(params);
  }
  append_literal(out, "}\n");
}

void append_notification(std::string& out, std::string_view method, std::string_view params) {
  append_request(out, {}, method, params);
}

void append_result(std::string& out, std::string_view id, std::string_view result) {
  append_literal(out, "{\"jsonrpc\":\"2.0\",\"id\":");
  out.append(id);
  append_literal(out, ",\"result\":");
  out.append(result);
  append_literal(out, "}\n");
}

void append_error(std::string& out, std::string_view id, int code, std::string_view message, std::string_view data) {
  append_literal(out, "{\"jsonrpc\":\"2.0\",\"id\":");
  out.append(id.empty() ? std::string_view("null") : id);
  append_literal(out, ",\"error\":{\"code\":");
  out.append(std::to_string(code));
  append_literal(out, ",\"message\":");
  append_json_string(out, message);
  if (!data.empty()) {
    append_literal(out, ",\"data\":");
    out.append(data);
  }
  append_literal(out, "}}\n");
}

}  // namespace machina::jsonrpc
