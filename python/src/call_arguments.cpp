// The parsers and text signatures made from the argument lists of call_arguments.hpp.
#include "call_arguments.hpp"

#include "py_convert.hpp"

#include <utility>

namespace machina::binding {

namespace {

struct CallParameterSpec {
  const char* name;
  std::string_view default_text;
  bool keyword_only;
};

constexpr CallParameterSpec kCallParameters[] = {
#define MACHINA_SPEC_ENTRY(name, default_text, keyword_only) {#name, default_text, keyword_only},
    MACHINA_TRANSPORT_CALL_PARAMETERS(MACHINA_SPEC_ENTRY)
#undef MACHINA_SPEC_ENTRY
};
constexpr std::size_t kCallCount = static_cast<std::size_t>(CallParameter::count);
static_assert(std::size(kCallParameters) == kCallCount);

constexpr std::size_t count_positional() {
  std::size_t n = 0;
  while (n < kCallCount && !kCallParameters[n].keyword_only) ++n;
  return n;
}
constexpr std::size_t count_required() {
  std::size_t n = 0;
  while (n < kCallCount && kCallParameters[n].default_text.empty()) ++n;
  return n;
}
constexpr std::size_t kPositional = count_positional();
constexpr std::size_t kRequired = count_required();

constexpr const char* kRequestArgumentNames[] = {
#define MACHINA_NAME_ENTRY(name) #name,
    MACHINA_REQUEST_ARGUMENTS(MACHINA_NAME_ENTRY)
#undef MACHINA_NAME_ENTRY
};
static_assert(std::size(kRequestArgumentNames) == static_cast<std::size_t>(RequestArgument::count));

const char* name_of(RequestArgument a) {
  return kRequestArgumentNames[static_cast<std::size_t>(a)];
}

std::string plural(std::size_t n, const char* one) {
  return std::to_string(n) + " " + one + (n == 1 ? "" : "s");
}

}  // namespace

TransportCallSignature::TransportCallSignature(std::string function) : function_(std::move(function)) {
  for (std::size_t k = 0; k < kCallCount; ++k) interned_[k] = PyUnicode_InternFromString(kCallParameters[k].name);
}

std::string TransportCallSignature::text_signature() const {
  std::string out = function_ + "($self";
  bool keywords = false;
  for (const auto& p : kCallParameters) {
    if (p.keyword_only && !keywords) {
      out += ", *";
      keywords = true;
    }
    out += ", ";
    out += p.name;
    if (!p.default_text.empty()) out += "=" + std::string(p.default_text);
  }
  return out + ")\n--\n\n";
}

Arguments<CallParameter> TransportCallSignature::parse(PyObject* const* args, Py_ssize_t nargs,
                                                       PyObject* kwnames) const {
  Arguments<CallParameter> v;
  const auto positional = static_cast<std::size_t>(nargs > 0 ? nargs - 1 : 0);  // after self
  if (positional > kPositional) {
    throw py::type_error(function_ + "() takes from " + std::to_string(kRequired) + " to " +
                         plural(kPositional, "positional argument") + " but " + std::to_string(positional) +
                         (positional == 1 ? " was" : " were") + " given");
  }
  for (std::size_t i = 0; i < positional; ++i) v[static_cast<CallParameter>(i)] = args[i + 1];
  const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t i = 0; i < nkw; ++i) {
    PyObject* name = PyTuple_GET_ITEM(kwnames, i);
    std::size_t at = kCallCount;
    for (std::size_t k = 0; k < kCallCount && at == kCallCount; ++k) {
      if (name == interned_[k] || PyUnicode_Compare(name, interned_[k]) == 0) at = k;
    }
    if (at == kCallCount) {
      throw py::type_error(function_ + "() got an unexpected keyword argument '" + py::str(name).cast<std::string>() +
                           "'");
    }
    PyObject*& slot = v[static_cast<CallParameter>(at)];
    if (slot != nullptr) {
      throw py::type_error(function_ + "() got multiple values for argument '" + py::str(name).cast<std::string>() +
                           "'");
    }
    slot = args[nargs + i];
  }
  for (std::size_t k = 0; k < kRequired; ++k) {
    if (v[static_cast<CallParameter>(k)] == nullptr) {
      throw py::type_error(function_ + "() missing 1 required positional argument: '" + kCallParameters[k].name + "'");
    }
  }
  return v;
}

RequestLayout::RequestLayout(std::string function, std::initializer_list<RequestArgument> layout, std::size_t required)
    : function_(std::move(function)), layout_(layout), required_(required) {}

std::string RequestLayout::text_signature() const {
  std::string out = function_ + "(";
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    out += (i == 0 ? "" : ", ");
    out += name_of(layout_[i]);
    if (i >= required_) out += "=None";
  }
  return out + ", /)";
}

Arguments<RequestArgument> RequestLayout::parse(PyObject* const* args, Py_ssize_t nargs) const {
  const auto n = static_cast<std::size_t>(nargs);
  if (n < required_ || n > layout_.size()) {
    throw py::type_error(function_ + "() takes " +
                         (required_ == layout_.size()
                              ? std::to_string(required_)
                              : std::to_string(required_) + " to " + std::to_string(layout_.size())) +
                         " positional arguments but " + std::to_string(n) + (n == 1 ? " was" : " were") + " given");
  }
  Arguments<RequestArgument> v;
  for (std::size_t i = 0; i < n; ++i) v[layout_[i]] = args[i];
  return v;
}

const RequestLayout& call_layout() {
  using A = RequestArgument;
  static const RequestLayout layout("call",
                                    {A::host, A::aid, A::input_json, A::session, A::idempotency_key, A::lease_token,
                                     A::timeout_ms, A::ds_state_json, A::user},
                                    8);
  return layout;
}

const RequestLayout& encode_request_layout() {
  using A = RequestArgument;
  static const RequestLayout layout(
      "encode_request",
      {A::id, A::aid, A::input_json, A::idempotency_key, A::lease_token, A::timeout_ms, A::ds_state_json, A::user}, 3);
  return layout;
}

RequestFields request_from(const Arguments<RequestArgument>& a) {
  using A = RequestArgument;
  RequestFields fields;
  Request& r = fields.request;
  r.aid = utf8(a.or_none(A::aid), "aid");
  r.input_json = utf8(a.or_none(A::input_json), "input_json");
  r.idempotency_key = optional_str(a.or_none(A::idempotency_key), "idempotency_key");
  r.lease_token = optional_str(a.or_none(A::lease_token), "lease_token");
  r.user = optional_str(a.or_none(A::user), "user");
  if (a.given(A::timeout_ms)) {
    const long long ms = PyLong_AsLongLong(a[A::timeout_ms]);
    if (ms == -1 && PyErr_Occurred()) throw py::error_already_set();
    r.timeout_ms = ms;
  }
  if (a.given(A::ds_state_json)) {
    Py_ssize_t n = 0;
    const char* p = PyUnicode_AsUTF8AndSize(a[A::ds_state_json], &n);
    if (p == nullptr) throw py::type_error("ds_state_json must be a str or None");
    fields.ds_state_json.emplace(p, static_cast<std::size_t>(n));
  }
  return fields;
}

}  // namespace machina::binding
