// See tool_protocol.hpp.
#include <machina/json_sax.hpp>
#include <machina/json_text.hpp>
#include <machina/tool_protocol.hpp>

#include <rapidjson/memorystream.h>
#include <rapidjson/reader.h>
#include <sys/random.h>

#include <cstdio>

namespace machina::tool_protocol {
namespace {

/// Reads an answer's top-level fields and the strings of its `error`; the raw text of
/// `result` and `trace` is cut out of the input by the stream's positions.
class AnswerSax : public JsonSax<AnswerSax> {
 public:
  AnswerSax(Answer& out, const rapidjson::MemoryStream& stream, std::string_view text)
      : JsonSax(stream, text), out_(out) {}

  bool Null() { return scalar(); }
  bool Bool(bool b) {
    if (depth_ == 1 && field_ == Field::ok) {
      out_.ok = b;
      saw_ok_ = true;
      return true;
    }
    return scalar();
  }
  bool RawNumber(const char*, rapidjson::SizeType, bool) { return scalar(); }
  bool String(const char* s, rapidjson::SizeType n, bool) {
    if (depth_ == 1 && field_ == Field::error) {
      out_.error_message.assign(s, n);  // a bare string names no type
      return true;
    }
    if (depth_ == 2 && field_ == Field::error) {
      if (error_field_ == ErrorField::type)
        out_.error_type.assign(s, n);
      else if (error_field_ == ErrorField::message)
        out_.error_message.assign(s, n);
      else if (error_field_ == ErrorField::reason_code)
        out_.reason_code.assign(s, n);
      return true;
    }
    return scalar();
  }
  bool Key(const char* s, rapidjson::SizeType n, bool) {
    const std::string_view k(s, n);
    if (depth_ == 1) {
      value_start_ = position();
      field_ = field_of(k, kFields, Field::unknown);
    } else if (depth_ == 2 && field_ == Field::error) {
      error_field_ = field_of(k, kErrorFields, ErrorField::other);
    }
    return true;
  }
  bool StartObject() {
    if (!room_for_one_more()) return fail(nesting_too_deep_text());
    if (depth_ == 1) trace_object_ = field_ == Field::trace;
    ++depth_;
    return true;
  }
  bool EndObject(rapidjson::SizeType) {
    --depth_;
    return container_end();
  }
  bool StartArray() {
    if (depth_ == 0) return false;  // an answer is an object
    if (!room_for_one_more()) return fail(nesting_too_deep_text());
    if (depth_ == 1) trace_object_ = false;
    ++depth_;
    return true;
  }
  bool EndArray(rapidjson::SizeType) {
    --depth_;
    return container_end();
  }

  bool finish(std::string& why) const {
    if (failed()) {
      why = this->why();
      return false;
    }
    if (!saw_ok_) {
      why = "an answer without a boolean 'ok'";
      return false;
    }
    return true;
  }

 private:
  enum class Field { ok, result, error, trace, unknown };
  enum class ErrorField { type, message, reason_code, other };
  static constexpr FieldKey<Field> kFields[] = {
      {"ok", Field::ok}, {"result", Field::result}, {"error", Field::error}, {"trace", Field::trace}};
  static constexpr FieldKey<ErrorField> kErrorFields[] = {
      {"type", ErrorField::type}, {"message", ErrorField::message}, {"reason_code", ErrorField::reason_code}};

  bool wrong(const char* field) { return fail(std::string("'") + field + "' has the wrong type"); }
  /// A scalar value just ended at the current position.
  bool scalar() {
    if (depth_ == 0) return false;  // a bare value is not an answer
    if (depth_ != 1) return true;
    switch (field_) {
      case Field::ok: return wrong("ok");
      case Field::result: out_.result = raw_since(value_start_); return true;
      default: return true;  // an `error` of null or a number: no message; a `trace` that is no object: none
    }
  }
  bool container_end() {
    if (depth_ != 1) return true;
    if (field_ == Field::result)
      out_.result = raw_since(value_start_);
    else if (field_ == Field::trace && trace_object_)
      out_.trace = raw_since(value_start_);
    else if (field_ == Field::ok)
      return wrong("ok");
    return true;
  }

  Answer& out_;
  Field field_ = Field::unknown;
  ErrorField error_field_ = ErrorField::other;
  std::size_t value_start_ = 0;
  bool saw_ok_ = false;
  bool trace_object_ = false;
};

}  // namespace

int apply_answer(const Answer& answer, CallContext& call) {
  if (answer.ok) {
    call.set_output(answer.result);
    return MACHINA_TOOL_OK;
  }
  call.error = answer.error_type + (answer.error_message.empty() ? "" : ": " + answer.error_message);
  return MACHINA_TOOL_ERROR;
}

void encode_local_call(const Call& c, std::string& out) {
  append_literal(out, "{\"protocol_version\":1,\"tool\":");
  append_json_string(out, c.tool);
  append_literal(out, ",\"entry\":");
  append_json_string(out, c.entry);
  append_literal(out, ",\"payload\":");
  out.append(c.payload_json);
  append_literal(out, ",\"sandbox\":");
  if (c.sandbox)
    append_literal(out, "true");
  else
    append_literal(out, "false");
  append_literal(out, ",\"trace_id\":");
  append_json_string(out, c.trace_id);
  if (!c.capability_context_json.empty()) {
    append_literal(out, ",\"capability_context\":");
    out.append(c.capability_context_json);
  }
  if (c.deadline_monotonic_ms > 0) {
    append_literal(out, ",\"deadline_monotonic_ms\":");
    out.append(std::to_string(c.deadline_monotonic_ms));
  }
  out.push_back('}');
}

void encode_service_call(const Call& c, std::int64_t timeout_ms, std::string_view app_root, std::string& out) {
  append_literal(out, "{\"protocol_version\":1,\"tool_name\":");
  append_json_string(out, c.tool);
  append_literal(out, ",\"kind\":\"python\",\"entry\":");
  append_json_string(out, c.entry);
  append_literal(out, ",\"payload\":");
  out.append(c.payload_json);
  append_literal(out, ",\"timeout_ms\":");
  out.append(std::to_string(timeout_ms));
  append_literal(out, ",\"trace_id\":");
  append_json_string(out, c.trace_id);
  append_literal(out, ",\"project\":{\"app_root\":");
  append_json_string(out, app_root);
  append_literal(out, ",\"flow\":\"\"}}");
}

bool decode_answer(std::string_view text, Answer& out, std::string& why) {
  out = Answer{};
  rapidjson::MemoryStream stream(text.data(), text.size());
  AnswerSax sax(out, stream, text);
  if (!parse_fields<rapidjson::kParseNumbersAsStringsFlag>(
          stream, sax, why, [](const rapidjson::ParseResult&) { return std::string("not a JSON object"); }))
    return false;
  if (out.ok && out.result.empty()) out.result = "null";
  if (!out.ok && out.error_type.empty()) out.error_type = "ToolError";
  return true;
}

std::string new_trace_id() {
  unsigned char b[16] = {};
  std::size_t got = 0;
  while (got < sizeof b) {
    const ssize_t n = getrandom(b + got, sizeof b - got, 0);
    if (n > 0) got += static_cast<std::size_t>(n);
  }
  b[6] = static_cast<unsigned char>((b[6] & 0x0F) | 0x40);  // version 4
  b[8] = static_cast<unsigned char>((b[8] & 0x3F) | 0x80);  // RFC 4122 variant
  char text[37];
  std::snprintf(text, sizeof text, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return text;
}

}  // namespace machina::tool_protocol
