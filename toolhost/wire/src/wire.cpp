// NDJSON request decoding (SAX, no DOM) and response encoding; see wire.hpp.
#include <machina/json_text.hpp>
#include <machina/jsonrpc.hpp>
#include <machina/rapid_sax.hpp>
#include <machina/wire.hpp>

#include <nlohmann/json.hpp>

#include <charconv>
#include <cstring>
#include <string>

namespace machina {
namespace {

using json = nlohmann::json;

constexpr const char* kTimeoutRule = kTimeoutRuleText;

/// The slot a name stands for: "DS0".."DS7", or "0".."7" (`numbered` says which form).
int slot_index(std::string_view name, bool& numbered) {
  if (name.size() == 3 && name[0] == 'D' && name[1] == 'S' && name[2] >= '0' && name[2] <= '7') {
    numbered = false;
    return name[2] - '0';
  }
  if (name.size() == 1 && name[0] >= '0' && name[0] <= '7') {
    numbered = true;
    return name[0] - '0';
  }
  return -1;
}

/// Decodes a ds_state object. Fed the events of the object's contents; reports its
/// own errors (kind invalid_ds_state) through `fail`.
class DsStateDecoder {
 public:
  explicit DsStateDecoder(DsUpdate& out) : out_(out) {}

  // Events; `depth` is relative: 1 = inside the ds_state object.
  bool key(int depth, std::string_view k) {
    if (depth == 1) {
      if (k == "delta") field_ = Field::delta;
      else if (k == "slots") field_ = Field::slots;
      else if (k == "removed_slots") field_ = Field::removed_slots;
      else return fail("unknown field '" + excerpt(k) + "'");
      const auto bit = 1u << static_cast<unsigned>(field_);
      if (seen_ & bit) return fail("duplicate field '" + std::string(k) + "'");
      seen_ |= bit;
      return true;
    }
    if (depth == 2) {  // slot name inside "slots"
      bool numbered = false;
      slot_ = slot_index(k, numbered);
      if (slot_ < 0) return fail("unknown slot '" + excerpt(k) + "' (slots are DS0..DS7, or 0..7)");
      if (!same_form(numbered)) return false;
      if (out_.changes.set & (1u << slot_)) return fail("duplicate slot " + std::string(k));
      artifact_ = Artifact{};
      artifact_seen_ = 0;
      return true;
    }
    // depth 3: artifact field
    if (k == "type") afield_ = AField::type;
    else if (k == "content_json") afield_ = AField::content_json;
    else if (k == "provenance") afield_ = AField::provenance;
    else if (k == "size_bytes") afield_ = AField::size_bytes;
    else return fail(slot_name() + ": unknown field '" + excerpt(k) + "'");
    const auto bit = 1u << static_cast<unsigned>(afield_);
    if (artifact_seen_ & bit) return fail(slot_name() + ": duplicate field '" + std::string(k) + "'");
    artifact_seen_ |= bit;
    return true;
  }

  bool start_container(int depth, bool object) {
    if (depth == 1 && field_ == Field::slots && object) return true;
    if (depth == 1 && field_ == Field::removed_slots && !object) return true;
    if (depth == 2 && field_ == Field::slots && object) return true;
    return wrong_type(depth);
  }

  bool end_container(int depth) {
    if (depth == 2 && field_ == Field::slots) return finish_artifact();
    return true;
  }

  bool string(int depth, std::string_view v) {
    if (depth == 2 && field_ == Field::removed_slots) {
      bool numbered = false;
      const int i = slot_index(v, numbered);
      if (i < 0) return fail("unknown slot '" + excerpt(v) + "' in removed_slots (slots are DS0..DS7, or 0..7)");
      return same_form(numbered) && remove(i);
    }
    if (depth == 3) {
      switch (afield_) {
        case AField::type: artifact_.type.assign(v); return true;
        case AField::content_json: artifact_.content_json.assign(v); return true;
        case AField::provenance: artifact_.provenance.assign(v); return true;
        case AField::size_bytes: break;
      }
    }
    return wrong_type(depth);
  }

  bool boolean(int depth, bool v) {
    if (depth == 1 && field_ == Field::delta) {
      out_.delta = v;
      return true;
    }
    return wrong_type(depth);
  }

  bool unsigned_number(int depth, std::uint64_t v) {
    if (depth == 3 && afield_ == AField::size_bytes) {
      artifact_.size_bytes = v;
      return true;
    }
    if (depth == 2 && field_ == Field::removed_slots) {  // the original client's integers
      if (v >= kDsSlots) return fail("unknown slot " + std::to_string(v) + " in removed_slots (slots are 0..7)");
      return same_form(true) && remove(static_cast<int>(v));
    }
    return wrong_type(depth);
  }

  bool other(int depth) { return wrong_type(depth); }

  bool finish() {
    if (!out_.delta && (seen_ & (1u << static_cast<unsigned>(Field::removed_slots))))
      return fail("'removed_slots' needs \"delta\": true");
    if (out_.changes.set & out_.changes.removed) return fail("a slot is both set and removed");
    return true;
  }

  const std::string& error() const { return error_; }

 private:
  enum class Field { delta, slots, removed_slots };
  enum class AField { type, content_json, provenance, size_bytes };

  std::string slot_name() const { return "slot DS" + std::to_string(slot_); }

  /// One request names its slots one way: "DS0".."DS7" or "0".."7" (its answer uses it).
  bool same_form(bool numbered) {
    if (form_seen_ && out_.numbered != numbered)
      return fail("slots are named both as DS0..DS7 and as 0..7: use one form");
    form_seen_ = true;
    out_.numbered = numbered;
    return true;
  }

  bool remove(int slot) {
    out_.changes.removed |= static_cast<std::uint8_t>(1u << slot);
    return true;
  }

  bool finish_artifact() {
    constexpr unsigned need = (1u << static_cast<unsigned>(AField::type)) |
                              (1u << static_cast<unsigned>(AField::content_json));
    if ((artifact_seen_ & need) != need)
      return fail(slot_name() + ": 'type' and 'content_json' are required");
    std::string why;
    if (!validate_json(artifact_.content_json, &why))
      return fail(slot_name() + ": content_json is not JSON (" + why + ")");
    if (!(artifact_seen_ & (1u << static_cast<unsigned>(AField::size_bytes))))
      artifact_.size_bytes = artifact_.content_json.size();
    out_.changes.slots[static_cast<std::size_t>(slot_)] = std::move(artifact_);
    out_.changes.set |= static_cast<std::uint8_t>(1u << slot_);
    return true;
  }

  // `depth`: 1 = a value of the ds_state object, 2 = a slot (or removed_slots
  // element), 3 = a field of an artifact.
  bool wrong_type(int depth) {
    if (depth == 1) {
      switch (field_) {
        case Field::delta: return fail("'delta' must be a boolean");
        case Field::slots: return fail("'slots' must be an object mapping slot names to artifacts");
        case Field::removed_slots: return fail("'removed_slots' must be an array of slot names (DS0..DS7) or numbers (0..7)");
      }
    }
    if (depth == 2) {
      if (field_ == Field::removed_slots) return fail("'removed_slots' must be an array of slot names (DS0..DS7) or numbers (0..7)");
      return fail(slot_name() + " must be an artifact object");
    }
    switch (afield_) {
      case AField::size_bytes: return fail(slot_name() + ": 'size_bytes' must be a non-negative integer");
      case AField::type: return fail(slot_name() + ": 'type' must be a string");
      case AField::content_json: return fail(slot_name() + ": 'content_json' must be a string");
      case AField::provenance: return fail(slot_name() + ": 'provenance' must be a string");
    }
    return fail("bad value");
  }

  bool fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    return false;
  }

  DsUpdate& out_;
  Field field_ = Field::delta;
  unsigned seen_ = 0;
  int slot_ = -1;
  Artifact artifact_;
  AField afield_ = AField::type;
  unsigned artifact_seen_ = 0;
  bool form_seen_ = false;
  std::string error_;
};

/// SAX handler for one request envelope.
class RequestSax {
 public:
  RequestSax(Request& req, bool aid_required) : req_(req), aid_required_(aid_required) {}

  // null stands for "absent" in every optional field (clients serialise None so).
  bool null() {
    if (!in_ds() && depth_ == 1 && field_ != Field::aid) {
      switch (field_) {
        case Field::input_json: req_.input_json = "{}"; break;
        case Field::ds_state: req_.ds_state.reset(); break;
        case Field::idempotency_key: req_.idempotency_key.reset(); break;
        case Field::lease_token: req_.lease_token.reset(); break;
        case Field::trace_id: req_.trace_id.reset(); break;
        case Field::user: req_.user.reset(); break;
        case Field::id: req_.id_json.clear(); break;
        case Field::timeout_ms: req_.timeout_ms.reset(); break;
        case Field::inputs: break;  // (absent: inputs_object_ stays false)
        case Field::aid:
        case Field::unknown: break;
      }
      return true;
    }
    return scalar_other("null");
  }
  bool boolean(bool v) {
    if (in_ds()) return ds_ok(ds_->boolean(rel(), v));
    return scalar_other("a boolean");
  }
  bool number_integer(json::number_integer_t v) {
    if (v >= 0) return number_unsigned(static_cast<json::number_unsigned_t>(v));
    if (in_ds()) return ds_ok(ds_->other(rel()));
    if (depth_ == 1 && field_ == Field::id) {
      req_.id_json = std::to_string(v);
      return true;
    }
    if (depth_ == 1 && field_ == Field::timeout_ms) {
      req_.timeout_ms = static_cast<std::int64_t>(v);  // the host refuses it (a request rule, not a format one)
      return true;
    }
    return scalar_other("a number");
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (in_ds()) return ds_ok(ds_->unsigned_number(rel(), v));
    if (depth_ == 1 && field_ == Field::id) {
      req_.id_json = std::to_string(v);
      return true;
    }
    if (depth_ == 1 && field_ == Field::timeout_ms) {
      req_.timeout_ms = static_cast<std::int64_t>(std::min<json::number_unsigned_t>(v, INT64_MAX));
      return true;
    }
    return scalar_other("a number");
  }
  bool number_float(json::number_float_t, const json::string_t&) {
    if (in_ds()) return ds_ok(ds_->other(rel()));
    return scalar_other("a number");
  }
  bool binary(json::binary_t&) { return scalar_other("binary"); }

  bool string(json::string_t& v) { return string_view_value(v); }
  bool key(json::string_t& k) { return key_view(k); }

  // Entry points without a std::string (the RapidJSON adapter uses these).
  bool string_view_value(std::string_view v) {
    if (in_ds()) return ds_ok(ds_->string(rel(), v));
    if (depth_ != 1) return skip_or_reject("a string");
    switch (field_) {
      case Field::aid: req_.aid.assign(v); return true;
      case Field::input_json: req_.input_json.assign(v); return true;
      case Field::idempotency_key: req_.idempotency_key.emplace(v); return true;
      case Field::lease_token: req_.lease_token.emplace(v); return true;
      case Field::trace_id: req_.trace_id.emplace(v); return true;
      case Field::user: req_.user.emplace(v); return true;
      case Field::id:
        req_.id_json.clear();
        append_json_string(req_.id_json, v);
        return true;
      case Field::ds_state: return ds_fail("must be an object");
      case Field::timeout_ms: return skip_or_reject("a string");
      case Field::inputs: return skip_or_reject("a string");
      case Field::unknown: return true;
    }
    return true;
  }

  bool start_object(std::size_t) {
    if (!enter()) return false;
    if (depth_ == 1) return true;
    if (depth_ == 2 && field_ == Field::inputs) {
      inputs_object_ = true;  // (its raw text is taken from the request: see inputs_given)
      return true;
    }
    if (in_ds()) return ds_ok(ds_->start_container(depth_ - 1 - ds_base_, true));
    if (depth_ == 2 && field_ == Field::ds_state) {
      ds_.emplace(req_.ds_state.emplace());
      ds_base_ = 1;
      return true;
    }
    return skip_or_reject("an object");
  }
  bool end_object() {
    if (in_ds()) {
      if (depth_ == ds_base_ + 1) {
        const bool ok = ds_ok(ds_->finish());
        ds_.reset();
        --depth_;
        return ok;
      }
      const bool ok = ds_ok(ds_->end_container(depth_ - 1 - ds_base_));
      --depth_;
      return ok;
    }
    --depth_;
    return true;
  }
  bool start_array(std::size_t) {
    if (!enter()) return false;
    if (depth_ == 1) return fail("expected a JSON object");
    if (in_ds()) return ds_ok(ds_->start_container(depth_ - 1 - ds_base_, false));
    return skip_or_reject("an array");
  }
  bool end_array() {
    --depth_;
    return true;
  }

  bool key_view(std::string_view k) {
    if (in_ds()) return ds_ok(ds_->key(rel(), k));
    if (depth_ != 1) return true;  // inside an unknown field's value
    field_ = field_named(k);
    if (field_ == Field::unknown) [[unlikely]] {
      // Extensions from newer clients are ignored; a lease under the keyword's name would be
      // ignored too, and the call refused for want of the lease it carries.
      if (k == "lease_token") return fail("field 'lease_token' is not a request field: a lease is sent as '_lease_token'");
      // (named only where the tool is named elsewhere: see finish())
      if (!aid_required_ && unknown_.size() < kUnknownNamed) unknown_.emplace_back(excerpt(k));
      return true;
    }
    if (seen_ & bit(field_)) return fail("duplicate field '" + std::string(k) + "'");
    seen_ |= bit(field_);
    return true;
  }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) {
    if (!failed_) {
      fail(describe_parse_error(position, e.what()));
      syntax_error_ = true;
    }
    return false;
  }

  bool syntax_error() const { return syntax_error_; }

  bool finish() {
    if (!saw_object_) return fail("expected a JSON object");
    if (aid_required_ && !(seen_ & bit(Field::aid))) return fail("missing field 'aid'");
    if (inputs_object_ && (seen_ & bit(Field::input_json))) {
      return fail("the tool's input goes in 'input_json' (its JSON text) or in 'inputs' (an object), not both");
    }
    if (!aid_required_ && !unknown_.empty() && !inputs_object_ && !(seen_ & (bit(Field::aid) | bit(Field::input_json)))) {
      // The tool is named outside the request, and the request holds no input but fields of
      // its own: most likely the tool's input, sent without its envelope.
      std::string names;
      for (const auto& n : unknown_) names += (names.empty() ? "'" : ", '") + n + "'";
      return fail("the request has no input but fields that are not request fields (" + names +
                  "): is it the tool's input? Send it inside the request, as {\"inputs\": {...}} (an object) or "
                  "{\"input_json\": \"...\"} (its JSON text)");
    }
    return true;
  }

  /// The request gave its input as an `inputs` object, whose raw text the caller takes from
  /// the request's text (this handler sees its parts only).
  bool inputs_given() const { return inputs_object_; }

  ErrorKind kind() const { return kind_; }
  const std::string& error() const { return error_; }

 private:
  enum class Field { aid, input_json, ds_state, idempotency_key, lease_token, id, timeout_ms, trace_id, user, inputs, unknown };
  static constexpr unsigned bit(Field f) noexcept { return 1u << static_cast<unsigned>(f); }
  static constexpr std::size_t kUnknownNamed = 4;  // unknown fields named in an error

  /// The request field a key names (its length tells most names apart; a name of that
  /// length is then compared as a whole, which the compiler does in a word or two).
  static Field field_named(std::string_view k) noexcept {
    // (not k == name: GCC calls an out-of-line compare for that, 150 instructions a request)
    auto is = [&k]<std::size_t N>(const char (&name)[N]) {
      return k.size() == N - 1 && std::memcmp(k.data(), name, N - 1) == 0;
    };
    switch (k.size()) {
      case 2: return is("id") ? Field::id : Field::unknown;
      case 3: return is("aid") ? Field::aid : Field::unknown;
      case 4: return is("user") ? Field::user : Field::unknown;
      case 6: return is("inputs") ? Field::inputs : Field::unknown;
      case 8: return is("ds_state") ? Field::ds_state : is("trace_id") ? Field::trace_id : Field::unknown;
      case 10: return is("input_json") ? Field::input_json : is("timeout_ms") ? Field::timeout_ms : Field::unknown;
      case 12: return is("_lease_token") ? Field::lease_token : Field::unknown;
      case 15: return is("idempotency_key") ? Field::idempotency_key : Field::unknown;
      default: return Field::unknown;
    }
  }


  bool in_ds() const { return ds_.has_value(); }

  bool enter() {
    if (depth_ == 0) saw_object_ = true;
    if (++depth_ > static_cast<int>(kMaxJsonDepth)) {
      return fail("nesting deeper than " + std::to_string(kMaxJsonDepth));
    }
    return true;
  }

  // A scalar that is not a string, at the current position.
  bool scalar_other(const char* what) {
    if (in_ds()) return ds_ok(ds_->other(rel()));
    return skip_or_reject(what);
  }

  // A value other than the expected scalar: fine inside an unknown (ignored) field,
  // an error for a known one. Containers under a known field are refused at once,
  // so deeper values always belong to an unknown field.
  bool skip_or_reject(const char* what) {
    if (depth_ == 0) return fail("expected a JSON object");
    if (field_ == Field::unknown) return true;
    switch (field_) {
      case Field::aid: return fail(std::string("field 'aid' must be a string, not ") + what);
      case Field::input_json:
        return fail(std::string("field 'input_json' must be a string holding JSON text, not ") + what);
      case Field::idempotency_key:
        return fail(std::string("field 'idempotency_key' must be a string, not ") + what);
      case Field::lease_token: return fail(std::string("field '_lease_token' must be a string, not ") + what);
      case Field::trace_id: return fail(std::string("field 'trace_id' must be a string, not ") + what);
      case Field::user: return fail(std::string("field 'user' must be a string, not ") + what);
      case Field::id: return fail(std::string("field 'id' must be a string or an integer, not ") + what);
      case Field::ds_state: return ds_fail("must be an object");
      case Field::timeout_ms: return fail(kTimeoutRule);
      case Field::inputs:
        // Anything inside the object is its content; the object itself is the only value.
        if (inputs_object_ && depth_ >= 2) return true;
        return fail(std::string("field 'inputs' must be an object (the tool's input), not ") + what);
      case Field::unknown: return true;
    }
    return true;
  }

  // Depth relative to the ds_state object (1 = its own keys and values).
  int rel() const { return depth_ - ds_base_; }

  bool ds_ok(bool ok) {
    if (!ok && !failed_) ds_fail(ds_->error());
    return ok;
  }

  bool ds_fail(const std::string& why) {
    if (!failed_) {
      failed_ = true;
      kind_ = ErrorKind::invalid_ds_state;
      error_ = "invalid ds_state: " + why;
    }
    return false;
  }

  bool fail(const std::string& why) {
    if (!failed_) {
      failed_ = true;
      kind_ = ErrorKind::malformed_request;
      error_ = "malformed request: " + why;
    }
    return false;
  }

  Request& req_;
  bool aid_required_;
  int depth_ = 0;
  int ds_base_ = 0;
  bool saw_object_ = false;
  Field field_ = Field::unknown;
  unsigned seen_ = 0;
  bool inputs_object_ = false;       // the `inputs` object has begun
  std::vector<std::string> unknown_;  // the first unknown fields' names (for an error)
  std::optional<DsStateDecoder> ds_;
  bool failed_ = false;
  bool syntax_error_ = false;
  ErrorKind kind_ = ErrorKind::none;
  std::string error_;
};

// Appends a string literal without measuring it at run time.
template <std::size_t N>
void put(std::string& out, const char (&literal)[N]) {
  out.append(literal, N - 1);
}

void append_artifact(std::string& out, const Artifact& a) {
  put(out, "{\"type\":");
  append_json_string(out, a.type);
  put(out, ",\"content_json\":");
  append_json_string(out, a.content_json);
  put(out, ",\"provenance\":");
  append_json_string(out, a.provenance);
  put(out, ",\"size_bytes\":");
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, a.size_bytes);
  (void)ec;
  out.append(buf, end);
  out.push_back('}');
}

void append_slots(std::string& out, const SlotChanges* changes, bool numbered) {
  out.push_back('{');
  bool first = true;
  for (std::size_t i = 0; changes != nullptr && i < kDsSlots; ++i) {
    if (!(changes->set & (1u << i)) || !changes->slots[i]) continue;
    if (!first) out.push_back(',');
    first = false;
    if (numbered) out.push_back('"');
    else put(out, "\"DS");
    out.push_back(static_cast<char>('0' + i));
    put(out, "\":");
    append_artifact(out, *changes->slots[i]);
  }
  out.push_back('}');
}

/// The raw text of a decoded request's `inputs` object as its input_json (the object was
/// checked whole by the decoding; its text is kept as the client wrote it).
bool take_inputs(std::string_view text, Request& request, Response& error) {
  std::string why;
  bool found = false;
  jsonrpc::for_each_member(
      text,
      [&](const jsonrpc::Member& m) {
        if (m.key != "inputs") return true;
        request.input_json.assign(m.raw);
        found = true;
        return false;
      },
      why);
  if (found) return true;
  error = Response::failure(ErrorKind::malformed_request, "malformed request: field 'inputs' could not be read");
  error.id_json = request.id_json;
  return false;
}

}  // namespace

bool decode_request(std::string_view text, Request& request, Response& error, bool nul_terminated,
                    bool aid_required) {
  if (std::string bad = reject_raw_bytes(text); !bad.empty()) {
    error = Response::failure(ErrorKind::malformed_request, "malformed request: " + bad);
    return false;
  }
  {
    RequestSax fast(request, aid_required);
    const auto outcome = detail::rapid_parse(text, fast, nul_terminated);
    if (outcome == detail::RapidOutcome::accepted && fast.finish()) {
      return !fast.inputs_given() || take_inputs(text, request, error);
    }
    if (outcome != detail::RapidOutcome::undecided) {
      error = Response::failure(fast.kind(), fast.error());
      error.id_json = request.id_json;
      return false;
    }
  }
  request = Request{};  // nlohmann decides from scratch and explains
  return detail::decode_request_reference(text, request, error, aid_required);
}

bool detail::decode_request_reference(std::string_view text, Request& request, Response& error, bool aid_required) {
  if (std::string bad = reject_raw_bytes(text); !bad.empty()) {
    error = Response::failure(ErrorKind::malformed_request, "malformed request: " + bad);
    return false;
  }
  RequestSax sax(request, aid_required);
  const char* begin = text.data();
  if (json::sax_parse(begin, begin + text.size(), &sax) && sax.finish()) {
    return !sax.inputs_given() || take_inputs(text, request, error);
  }
  if (sax.kind() == ErrorKind::none) {
    error = Response::failure(ErrorKind::malformed_request, "malformed request: invalid JSON");
  } else {
    error = Response::failure(sax.kind(), sax.error());
  }
  // No id is echoed from a request that fails as JSON syntax: its id token may have
  // been cut short ("id":01 reads as 0) and would point at another request. (A field
  // error found earlier keeps the id: the parse stopped there, after a complete id.)
  if (!sax.syntax_error()) error.id_json = request.id_json;
  return false;
}

bool decode_ds_state(std::string_view text, DsUpdate& update, std::string& why) {
  Request req;
  Response err;
  std::string wrapped;
  wrapped.reserve(text.size() + 16);
  wrapped.append("{\"ds_state\":").append(text).push_back('}');
  if (!decode_request(wrapped, req, err, false, /*aid_required=*/false)) {
    why = err.error;
    return false;
  }
  update = req.ds_state.value_or(DsUpdate{});
  return true;
}

void encode_ds_state(const DsReport& report, std::string& out) {
  if (report.mode == DsReport::Mode::full) {
    put(out, "{\"slots\":");
    append_slots(out, report.changes.get(), report.numbered);
    out.push_back('}');
    return;
  }
  if (!report.changes) {  // most calls change nothing
    put(out, "{\"delta\":true,\"slots\":{},\"removed_slots\":[]}");
    return;
  }
  put(out, "{\"delta\":true,\"slots\":");
  append_slots(out, report.changes.get(), report.numbered);
  put(out, ",\"removed_slots\":[");
  bool first = true;
  const std::uint8_t removed = report.changes ? report.changes->removed : 0;
  for (std::size_t i = 0; i < kDsSlots; ++i) {
    if (!(removed & (1u << i))) continue;
    if (!first) out.push_back(',');
    first = false;
    if (report.numbered) {
      out.push_back(static_cast<char>('0' + i));
      continue;
    }
    put(out, "\"DS");
    out.push_back(static_cast<char>('0' + i));
    out.push_back('"');
  }
  put(out, "]}");
}

void encode_response(const Response& r, std::string& out) {
  out.push_back('{');
  if (!r.id_json.empty()) {
    put(out, "\"id\":");
    out.append(r.id_json);
    out.push_back(',');
  }
  if (r.ok()) put(out, "\"ok\":true");
  else put(out, "\"ok\":false");
  const ErrorKindInfo& info = error_info(r.kind);
  put(out, ",\"status\":\"");
  out.append(status_name(info.status));
  out.push_back('"');
  if (info.call_response) {
    put(out, ",\"output_json\":");
    append_json_string(out, r.output_json);
  }
  put(out, ",\"error\":");
  append_json_string(out, r.error);
  if (!r.ok()) {
    put(out, ",\"code\":\"");
    out.append(info.code);
    out.push_back('"');
  }
  if (r.kind == ErrorKind::lease_required) {
    put(out, ",\"tier\":");
    out.append(std::to_string(r.lease_tier));
    put(out, ",\"aid\":");
    append_json_string(out, r.lease_aid);
  } else if (r.kind == ErrorKind::lease_rejected) {
    put(out, ",\"reason\":");
    append_json_string(out, r.lease_reason);
  }
  if (!r.hint.empty()) [[unlikely]] {
    put(out, ",\"hint\":");
    append_json_string(out, r.hint);
  }
  if (info.call_response) {
    put(out, ",\"ds_state\":");
    encode_ds_state(r.ds_state, out);
  }
  if (r.idempotent_hit) put(out, ",\"idempotent_hit\":true");
  if (!r.trace_json.empty()) {
    put(out, ",\"trace\":");
    out.append(r.trace_json);
  }
  put(out, "}\n");
}

}  // namespace machina
