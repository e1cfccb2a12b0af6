// The arguments of one tool call as the compiled entry points take them, each list
// written once: the parsers, the text signatures (docstrings) and the error texts are
// made from these lists.
#pragma once

#include <machina/request.hpp>

#include <pybind11/pybind11.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace machina::binding {

/// Transport.call's parameters after self, in order (machina_dispatch._transport.Transport.call):
/// X(name, default as Python text or "" when required, keyword-only).
#define MACHINA_TRANSPORT_CALL_PARAMETERS(X) \
  X(aid, "", false)                          \
  X(inputs, "None", false)                   \
  X(state, "None", true)                     \
  X(idempotency_key, "None", true)           \
  X(lease_token, "None", true)               \
  X(timeout, "None", true)                   \
  X(check, "True", true)                     \
  X(user, "None", true)

enum class CallParameter : std::uint8_t {
#define MACHINA_ENUM_ENTRY(name, default_text, keyword_only) name,
  MACHINA_TRANSPORT_CALL_PARAMETERS(MACHINA_ENUM_ENTRY)
#undef MACHINA_ENUM_ENTRY
      count
};

/// The fields of one request as the positional-only entry points take them (_core.call,
/// _core.encode_request, the items of _core.encode_requests); each entry point's layout
/// lists the ones it takes, in its order.
#define MACHINA_REQUEST_ARGUMENTS(X) \
  X(host)                            \
  X(session)                         \
  X(id)                              \
  X(aid)                             \
  X(input_json)                      \
  X(idempotency_key)                 \
  X(lease_token)                     \
  X(timeout_ms)                      \
  X(ds_state_json)                   \
  X(user)

enum class RequestArgument : std::uint8_t {
#define MACHINA_ENUM_ENTRY(name) name,
  MACHINA_REQUEST_ARGUMENTS(MACHINA_ENUM_ENTRY)
#undef MACHINA_ENUM_ENTRY
      count
};

/// Arguments by name: nullptr where not given.
template <class Name>
class Arguments {
 public:
  PyObject*& operator[](Name n) { return values_[static_cast<std::size_t>(n)]; }
  PyObject* operator[](Name n) const { return values_[static_cast<std::size_t>(n)]; }
  /// Given and not None.
  bool given(Name n) const { return (*this)[n] != nullptr && (*this)[n] != Py_None; }
  /// The argument, or None when not given.
  PyObject* or_none(Name n) const { return (*this)[n] != nullptr ? (*this)[n] : Py_None; }

 private:
  std::array<PyObject*, static_cast<std::size_t>(Name::count)> values_{};
};

/// A function taking Transport.call's parameters (METH_FASTCALL | METH_KEYWORDS), bound as
/// a method: args[0] is self.
class TransportCallSignature {
 public:
  explicit TransportCallSignature(std::string function);
  /// `function($self, aid, inputs=None, *, state=None, ...)` and the docstring's separator.
  std::string text_signature() const;
  /// The arguments after self. Throws TypeError with Python's own texts for a call the
  /// signature does not accept.
  Arguments<CallParameter> parse(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) const;

 private:
  std::string function_;
  std::array<PyObject*, static_cast<std::size_t>(CallParameter::count)> interned_{};
};

/// A positional-only function taking request fields (METH_FASTCALL): the first `required`
/// of `layout` must be given, the rest default to None.
class RequestLayout {
 public:
  RequestLayout(std::string function, std::initializer_list<RequestArgument> layout, std::size_t required);
  /// `function(a, b, c=None, /)`.
  std::string text_signature() const;
  /// The arguments by name. Throws TypeError for a count outside the layout's.
  Arguments<RequestArgument> parse(PyObject* const* args, Py_ssize_t nargs) const;

 private:
  std::string function_;
  std::vector<RequestArgument> layout_;
  std::size_t required_;
};

/// _core.call(host, aid, input_json, session, idempotency_key, lease_token, timeout_ms,
/// ds_state_json, user=None, /).
const RequestLayout& call_layout();
/// _core.encode_request(id, aid, input_json, idempotency_key=None, ..., user=None, /), and
/// each item of _core.encode_requests.
const RequestLayout& encode_request_layout();

/// A request as the fields aid .. user describe it.
struct RequestFields {
  Request request;
  /// Its ds_state text: a view of the argument's UTF-8; nothing for None.
  std::optional<std::string_view> ds_state_json;
};

/// The request the fields aid .. user describe (host, session and id are the caller's).
/// Throws TypeError naming the field that has the wrong type.
RequestFields request_from(const Arguments<RequestArgument>& a);

}  // namespace machina::binding
