// See ndjson_client.hpp.
#include <machina/ds_state.hpp>
#include <machina/json_sax.hpp>
#include <machina/json_text.hpp>
#include <machina/ndjson_client.hpp>
#include <machina/ndjson_wire.hpp>
#include <machina/spin_wait.hpp>

#include <rapidjson/memorystream.h>
#include <rapidjson/reader.h>

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <memory>
#include <unordered_set>

namespace machina {

namespace {

void put_int(std::string& out, std::int64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  (void)ec;
  out.append(buf, end);
}

/// Reads the top-level fields of a response; the ds_state object is kept as raw text
/// (its start and end are taken from the stream's position), and so is the trace object.
/// Numbers arrive typed (an id or a tier must be an integer).
class ResponseSax : public JsonSax<ResponseSax> {
 public:
  ResponseSax(ResponseFields& out, const rapidjson::MemoryStream& stream, std::string_view text)
      : JsonSax(stream, text), out_(out) {}

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
    return u > static_cast<std::uint64_t>(INT64_MAX) ? (depth_ != 1 || wrong_type())
                                                     : Int64(static_cast<std::int64_t>(u));
  }
  bool Int64(std::int64_t i) {
    if (depth_ != 1) return true;
    if (field_ == Field::id)
      out_.id = i;
    else if (field_ == Field::tier)
      out_.lease_tier = i;
    else
      return wrong_type();
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
      case Field::hint: out_.hint = std::move(v); return true;
      default: return wrong_type();
    }
  }
  bool Key(const char* s, rapidjson::SizeType n, bool) {
    if (depth_ == 1) field_ = field_of(std::string_view(s, n), kFields, Field::unknown);
    return true;
  }
  bool StartObject() {
    if (!room_for_one_more()) return too_deep_failure();
    if (depth_ == 1 && (field_ == Field::ds_state || field_ == Field::trace))
      object_start_ = position() - 1;
    else if (depth_ == 1 && field_ != Field::unknown)
      return wrong_type();
    ++depth_;
    return true;
  }
  bool EndObject(rapidjson::SizeType) {
    --depth_;
    if (depth_ == 1 && field_ == Field::ds_state) out_.ds_state = object_text();
    if (depth_ == 1 && field_ == Field::trace) out_.trace = object_text();
    return true;
  }
  bool StartArray() {
    if (depth_ == 0) return false;
    if (!room_for_one_more()) return too_deep_failure();
    if (depth_ == 1 && field_ != Field::unknown) return wrong_type();
    ++depth_;
    return true;
  }
  bool EndArray(rapidjson::SizeType) {
    --depth_;
    return true;
  }

  bool finish(std::string& why) const {
    if (failed()) {
      why = this->why();
      return false;
    }
    if (!saw_ok_) {
      why = "a response without 'ok'";
      return false;
    }
    return true;
  }

 private:
  enum class Field {
    id,
    ok,
    status,
    output_json,
    error,
    code,
    tier,
    aid,
    reason,
    hint,
    ds_state,
    trace,
    idempotent_hit,
    unknown
  };
  static constexpr FieldKey<Field> kFields[] = {{"id", Field::id},
                                                {"ok", Field::ok},
                                                {"status", Field::status},
                                                {"output_json", Field::output_json},
                                                {"error", Field::error},
                                                {"code", Field::code},
                                                {"tier", Field::tier},
                                                {"aid", Field::aid},
                                                {"reason", Field::reason},
                                                {"hint", Field::hint},
                                                {"ds_state", Field::ds_state},
                                                {"trace", Field::trace},
                                                {"idempotent_hit", Field::idempotent_hit}};

  bool too_deep_failure() { return fail(nesting_too_deep_text() + " in a response"); }
  // A value of the wrong type for a known field (an unknown field's value is ignored).
  bool wrong_type() {
    if (field_ == Field::unknown) return true;
    return fail("field has the wrong type in a response");
  }
  std::string_view object_text() const { return text().substr(object_start_, position() - object_start_); }

  ResponseFields& out_;
  Field field_ = Field::unknown;
  std::size_t object_start_ = 0;
  bool saw_ok_ = false;
};

}  // namespace

void encode_request(const Request& r, std::optional<std::int64_t> id, std::string_view ds_state_json,
                    std::string& out) {
  out.push_back('{');
  if (id) {
    append_literal(out, "\"id\":");
    put_int(out, *id);
    out.push_back(',');
  }
  append_literal(out, "\"aid\":");
  append_json_string(out, r.aid);
  append_literal(out, ",\"input_json\":");
  append_json_string(out, r.input_json);
  if (r.idempotency_key) {
    append_literal(out, ",\"idempotency_key\":");
    append_json_string(out, *r.idempotency_key);
  }
  if (r.lease_token) {
    append_literal(out, ",\"_lease_token\":");
    append_json_string(out, *r.lease_token);
  }
  if (r.timeout_ms) {
    append_literal(out, ",\"timeout_ms\":");
    put_int(out, *r.timeout_ms);
  }
  if (r.trace_id) {
    append_literal(out, ",\"trace_id\":");
    append_json_string(out, *r.trace_id);
  }
  if (r.user) {
    append_literal(out, ",\"user\":");
    append_json_string(out, *r.user);
  }
  if (!ds_state_json.empty()) {
    append_literal(out, ",\"ds_state\":");
    out.append(ds_state_json);
  }
  append_literal(out, "}\n");
}

bool decode_response(std::string_view text, ResponseFields& out, std::string& why) {
  out = ResponseFields{};
  rapidjson::MemoryStream stream(text.data(), text.size());
  ResponseSax sax(out, stream, text);
  // The first event must open an object: a bare value is not a response.
  return parse_fields<rapidjson::kParseDefaultFlags>(stream, sax, why, [](const rapidjson::ParseResult& result) {
    return "not a JSON object (" + std::to_string(result.Offset()) + ")";
  });
}

bool delta_between(std::string_view before, std::string_view after, std::string& out, std::string& why) {
  DsUpdate a, b;
  if (!decode_ds_state(before, a, why) || !decode_ds_state(after, b, why)) return false;
  CallerState session(/*respond_with_delta=*/true);
  a.delta = false;
  session.apply(a);
  SlotChanges changes = b.changes;
  for (std::size_t i = 0; i < kDsSlots; ++i) {
    const auto bit = static_cast<std::uint8_t>(1u << i);
    if (!(changes.set & bit)) changes.removed |= bit;
  }
  out.clear();
  if (const auto real = session.commit(changes)) encode_ds_state({DsReport::Mode::delta, real}, out);
  return true;
}

std::size_t match_responses(std::string_view text, std::size_t start, const OpenRequests& open,
                            const std::function<void(std::int64_t, const ResponseFields&)>& take) {
  ResponseFields fields;
  std::string why;
  std::unordered_set<std::int64_t> answered;  // by earlier lines of this text
  std::size_t at = std::min(start, text.size());
  for (;;) {
    const std::size_t nl = text.find('\n', at);
    if (nl == std::string_view::npos) return at;
    const std::string_view line = text.substr(at, nl - at);
    at = nl + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    if (!decode_response(line, fields, why)) throw StreamError("unreadable response: " + why);
    std::optional<std::int64_t> id = fields.id;
    if (id) {
      if (!open.is_open(*id) || answered.count(*id))
        throw StreamError("a response for an unknown id " + std::to_string(*id));
    } else {
      open.oldest_first([&](std::int64_t candidate) {
        if (answered.count(candidate)) return true;
        id = candidate;
        return false;
      });
      if (!id) throw StreamError("a response without an id while no request is open");
    }
    answered.insert(*id);
    take(*id, fields);
  }
}

RoundTrip round_trip(int fd_in, int fd_out, std::string_view request, std::chrono::steady_clock::time_point until,
                     std::chrono::microseconds spin, const std::function<void()>& written_all) {
  constexpr std::size_t kChunk = 256 * 1024;
  static const bool can_spin = may_run_on_two_cpus();
  RoundTrip rt;
  bool writing = true;
  const auto stop_writing = [&] {
    if (!writing) return;
    writing = false;
    written_all();
  };
  bool spun = !can_spin;
  for (;;) {
    if (rt.written < request.size()) {
      const ssize_t n = ::write(fd_in, request.data() + rt.written, request.size() - rt.written);
      if (n > 0)
        rt.written += static_cast<std::size_t>(n);
      else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        rt.status = RoundTrip::Status::write_failed;
        break;
      }
      if (rt.written == request.size()) stop_writing();
    }
    const bool all_written = rt.written == request.size();
    if (all_written && rt.data.find('\n') != std::string::npos) break;
    if (all_written && !spun) {
      spun = true;  // once: the rest of a long answer is waited for in poll()
      spin_until_readable(fd_out, spin);
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() < 0) {
      rt.status = RoundTrip::Status::out_of_time;
      break;
    }
    pollfd fds[2] = {{fd_out, POLLIN, 0}, {all_written ? -1 : fd_in, POLLOUT, 0}};
    const int ready = ::poll(fds, 2, static_cast<int>(std::min<long long>(left.count() + 1, 1 << 30)));
    if (ready < 0 && errno != EINTR) {
      rt.status = RoundTrip::Status::write_failed;
      break;
    }
    if (ready > 0 && (fds[0].revents & (POLLIN | POLLHUP | POLLERR))) {
      thread_local const std::unique_ptr<char[]> chunk = std::make_unique_for_overwrite<char[]>(kChunk);
      const ssize_t n = ::read(fd_out, chunk.get(), kChunk);  // not into `data`: no 256 KiB clearing
      if (n > 0) rt.data.append(chunk.get(), static_cast<std::size_t>(n));
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        rt.status = RoundTrip::Status::end_of_output;
        break;
      }
    }
  }
  stop_writing();
  return rt;
}

}  // namespace machina
