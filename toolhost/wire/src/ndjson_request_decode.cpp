// NDJSON request decoding (decode_request in ndjson_wire.hpp): one SAX pass over the
// envelope with no DOM, the reference parser deciding only what the fast one cannot.
#include "ds_state_decoder.hpp"

#include <machina/json_sax.hpp>
#include <machina/json_text.hpp>
#include <machina/jsonrpc.hpp>
#include <machina/ndjson_wire.hpp>
#include <machina/rapid_sax.hpp>

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace machina {
namespace {

using json = nlohmann::json;
using detail::DsStateDecoder;

constexpr const char* kTimeoutRule = kTimeoutRuleText;

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
      if (k == "lease_token")
        return fail("field 'lease_token' is not a request field: a lease is sent as '_lease_token'");
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
    if (!aid_required_ && !unknown_.empty() && !inputs_object_ &&
        !(seen_ & (bit(Field::aid) | bit(Field::input_json)))) {
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
  enum class Field {
    aid,
    input_json,
    ds_state,
    idempotency_key,
    lease_token,
    id,
    timeout_ms,
    trace_id,
    user,
    inputs,
    unknown
  };
  static constexpr unsigned bit(Field f) noexcept { return 1u << static_cast<unsigned>(f); }
  static constexpr std::size_t kUnknownNamed = 4;  // unknown fields named in an error

  /// The request field a key names (its length tells most names apart; a name of that
  /// length is then compared as a whole, which the compiler does in a word or two).
  static Field field_named(std::string_view k) noexcept {
    // (not k == name: GCC calls an out-of-line compare for that)
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
    if (++depth_ > static_cast<int>(kMaxJsonDepth)) return fail(nesting_too_deep_text());
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
      case Field::idempotency_key: return fail(std::string("field 'idempotency_key' must be a string, not ") + what);
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
  bool inputs_object_ = false;        // the `inputs` object has begun
  std::vector<std::string> unknown_;  // the first unknown fields' names (for an error)
  std::optional<DsStateDecoder> ds_;
  bool failed_ = false;
  bool syntax_error_ = false;
  ErrorKind kind_ = ErrorKind::none;
  std::string error_;
};

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

bool decode_request(std::string_view text, Request& request, Response& error, bool nul_terminated, bool aid_required) {
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

}  // namespace machina
