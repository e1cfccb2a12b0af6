// See wire_client.hpp.
#include <machina/json_text.hpp>
#include <machina/rapid_sax.hpp>
#include <machina/wire_client.hpp>

#include <rapidjson/memorystream.h>
#include <rapidjson/reader.h>

#include <charconv>

namespace machina {

namespace {

template <std::size_t N>
void put(std::string& out, const char (&literal)[N]) {
  out.append(literal, N - 1);
}

void put_int(std::string& out, std::int64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  (void)ec;
  out.append(buf, end);
}

/// Reads the top-level fields of a response; the ds_state object is kept as raw text
/// (its start and end are taken from the stream's position).
class ResponseSax {
 public:
  ResponseSax(ResponseFields& out, const rapidjson::MemoryStream& stream, std::string_view text)
      : out_(out), stream_(stream), text_(text) {}

  bool Null() { return depth_ != 1 || wrong_type(); }
  bool Bool(bool b) {
    if (depth_ != 1) return true;
    if (field_ == Field::ok) {
      out_.ok = b;
      saw_ok_ = true;
    } else if (field_ == Field::idempotent_hit) {
      out_.idempotent_hit = b;
    } else {
      return wrong_type();
    }
    return true;
  }
  bool Int(int i) { return Int64(i); }
  bool Uint(unsigned u) { return Int64(u); }
  bool Uint64(std::uint64_t u) {
    return u > static_cast<std::uint64_t>(INT64_MAX) ? (depth_ != 1 || wrong_type()) : Int64(static_cast<std::int64_t>(u));
  }
  bool Int64(std::int64_t i) {
    if (depth_ != 1) return true;
    if (field_ == Field::id) out_.id = i;
    else if (field_ == Field::tier) out_.lease_tier = i;
    else return wrong_type();
    return true;
  }
  bool Double(double) { return depth_ != 1 || wrong_type(); }
  bool RawNumber(const char*, rapidjson::SizeType, bool) { return true; }
  bool String(const char* s, rapidjson::SizeType n, bool) {
    if (depth_ != 1) return true;
    std::string v(s, n);
    switch (field_) {
      case Field::status: out_.status = std::move(v); return true;
      case Field::output_json: out_.output_json = std::move(v); return true;
      case Field::error: out_.error = std::move(v); return true;
      case Field::code: out_.code = std::move(v); return true;
      case Field::aid: out_.lease_aid = std::move(v); return true;
      case Field::reason: out_.lease_reason = std::move(v); return true;
      default: return wrong_type();
    }
  }
  bool Key(const char* s, rapidjson::SizeType n, bool) {
    if (depth_ != 1) return true;
    const std::string_view k(s, n);
    if (k == "id") field_ = Field::id;
    else if (k == "ok") field_ = Field::ok;
    else if (k == "status") field_ = Field::status;
    else if (k == "output_json") field_ = Field::output_json;
    else if (k == "error") field_ = Field::error;
    else if (k == "code") field_ = Field::code;
    else if (k == "tier") field_ = Field::tier;
    else if (k == "aid") field_ = Field::aid;
    else if (k == "reason") field_ = Field::reason;
    else if (k == "ds_state") field_ = Field::ds_state;
    else if (k == "idempotent_hit") field_ = Field::idempotent_hit;
    else field_ = Field::unknown;
    return true;
  }
  bool StartObject() {
    if (depth_ == 1 && field_ == Field::ds_state) ds_start_ = stream_.Tell() - 1;
    else if (depth_ == 1 && field_ != Field::unknown) return wrong_type();
    ++depth_;
    return true;
  }
  bool EndObject(rapidjson::SizeType) {
    --depth_;
    if (depth_ == 1 && field_ == Field::ds_state) out_.ds_state = text_.substr(ds_start_, stream_.Tell() - ds_start_);
    return true;
  }
  bool StartArray() {
    if (depth_ == 0) return false;
    if (depth_ == 1 && field_ != Field::unknown) return wrong_type();
    ++depth_;
    return true;
  }
  bool EndArray(rapidjson::SizeType) {
    --depth_;
    return true;
  }

  bool finish(std::string& why) const {
    if (!why_.empty()) {
      why = why_;
      return false;
    }
    if (!saw_ok_) {
      why = "a response without 'ok'";
      return false;
    }
    return true;
  }

 private:
  enum class Field { id, ok, status, output_json, error, code, tier, aid, reason, ds_state, idempotent_hit, unknown };

  // A value of the wrong type for a known field (an unknown field's value is ignored).
  bool wrong_type() {
    if (field_ == Field::unknown) return true;
    why_ = "field has the wrong type in a response";
    return false;
  }

  ResponseFields& out_;
  const rapidjson::MemoryStream& stream_;
  std::string_view text_;
  int depth_ = 0;
  Field field_ = Field::unknown;
  std::size_t ds_start_ = 0;
  bool saw_ok_ = false;
  std::string why_;
};

}  // namespace

void encode_request(const Request& r, std::optional<std::int64_t> id, std::string_view ds_state_json,
                    std::string& out) {
  out.push_back('{');
  if (id) {
    put(out, "\"id\":");
    put_int(out, *id);
    out.push_back(',');
  }
  put(out, "\"aid\":");
  append_json_string(out, r.aid);
  put(out, ",\"input_json\":");
  append_json_string(out, r.input_json);
  if (r.idempotency_key) {
    put(out, ",\"idempotency_key\":");
    append_json_string(out, *r.idempotency_key);
  }
  if (r.lease_token) {
    put(out, ",\"_lease_token\":");
    append_json_string(out, *r.lease_token);
  }
  if (r.timeout_ms) {
    put(out, ",\"timeout_ms\":");
    put_int(out, *r.timeout_ms);
  }
  if (!ds_state_json.empty()) {
    put(out, ",\"ds_state\":");
    out.append(ds_state_json);
  }
  put(out, "}\n");
}

bool decode_response(std::string_view text, ResponseFields& out, std::string& why) {
  out = ResponseFields{};
  rapidjson::MemoryStream stream(text.data(), text.size());
  ResponseSax sax(out, stream, text);
  rapidjson::Reader reader;
  // The first event must open an object: a bare value is not a response.
  const auto result = reader.Parse<rapidjson::kParseDefaultFlags>(stream, sax);
  if (!result) {
    std::string inner;
    if (!sax.finish(inner) && !inner.empty() && inner != "a response without 'ok'") why = inner;
    else why = "not a JSON object (" + std::to_string(result.Offset()) + ")";
    return false;
  }
  return sax.finish(why);
}

}  // namespace machina
