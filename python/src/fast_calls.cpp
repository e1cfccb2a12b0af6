// The raw calls of the hot path, without pybind11's argument machinery: _core.call,
// _core.encode_request and InProcess.call, each parsing its arguments through the lists
// of call_arguments.hpp.
#include "call_arguments.hpp"
#include "module_parts.hpp"
#include "py_convert.hpp"
#include "result_factory.hpp"

#include <machina/ds_state_codec.hpp>
#include <machina/ndjson_client.hpp>
#include <machina/tool_host.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace machina::binding {

using namespace py::literals;

namespace {

// How calls from Python are labelled: the caller is the program this process runs.
constexpr FrontLabel kPythonFront{"python", /*local_caller=*/true};

/// What InProcess.call needs of its transport while it is open (InProcess._fast; None once
/// closed): the host, the transport's default timeout, and its Python helpers for what is
/// not on the hot path (inputs that are not a str, a state, a timeout of the call's own).
struct InProcessState {
  py::object host;  // the _core.Host, kept alive while the transport is open
  std::int64_t default_timeout_ms;
  py::object input_text;   // (aid, inputs) -> str | ToolResult: the input's JSON text, or the refusal
  py::object state_text;   // (aid, state) -> str | ToolResult: the state's JSON text, or the refusal
  py::object apply_state;  // (state, result) -> None: a successful call's changes applied to the state
  py::object timeout_ms;   // (seconds) -> int: a call's own timeout as the request's timeout_ms
  ToolHost* tool_host = nullptr;
};

/// One in-process call: the host (which applies every rule to the request), with the GIL
/// released while it runs.
Response handle_in_process(Host& host, Request& req, CallerState& session,
                           const std::optional<std::string_view>& ds_state_json) {
  if (ds_state_json) {
    DsUpdate update;
    std::string why;
    if (!decode_ds_state(*ds_state_json, update, why)) return Response::failure(ErrorKind::invalid_ds_state, why);
    req.ds_state = std::move(update);
  }
  py::gil_scoped_release release;
  return host.handle(req, session);
}

const TransportCallSignature& transport_call() {
  static const TransportCallSignature signature("call");
  return signature;
}

/// _core.call: Host.call without pybind11's argument machinery (positional only).
PyObject* fast_call(PyObject*, PyObject* const* args, Py_ssize_t nargs) noexcept {
  try {
    using A = RequestArgument;
    const Arguments<A> a = call_layout().parse(args, nargs);
    auto& host = bound<ToolHost>(a[A::host]).host();
    auto& session = bound<CallerState>(a[A::session]);
    RequestFields call = request_from(a);
    call.request.front = kPythonFront;
    const Response r = handle_in_process(host, call.request, session, call.ds_state_json);
    return results().make(py::reinterpret_borrow<py::object>(a[A::aid]), r).release().ptr();
  } catch (...) {
    return python_error();
  }
}

/// InProcess.call, compiled: the one path of every in-process call. Bound to InProcess as
/// an instance method, so args[0] is the transport. Each call runs in an empty session:
/// one per thread, replaced when a call left something in it.
PyObject* inprocess_call(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) noexcept {
  static PyObject* const k_fast = PyUnicode_InternFromString("_fast");
  static PyObject* const k_raise = PyUnicode_InternFromString("raise_for_error");
  using P = CallParameter;
  try {
    const Arguments<P> v = transport_call().parse(args, nargs, kwnames);
    bool check = true;
    if (v[P::check] != nullptr) {
      const int truth = PyObject_IsTrue(v[P::check]);
      if (truth < 0) return nullptr;
      check = truth != 0;
    }
    const py::object fast = py::reinterpret_steal<py::object>(PyObject_GetAttr(args[0], k_fast));
    if (!fast) return nullptr;
    if (fast.is_none()) {
      PyErr_SetString(PyExc_RuntimeError, "the InProcess transport is closed");
      return nullptr;
    }
    const InProcessState& self = bound<InProcessState>(fast.ptr());
    Request req;
    req.front = kPythonFront;
    req.aid = utf8(v[P::aid], "aid");
    req.idempotency_key = optional_str(v.or_none(P::idempotency_key), "idempotency_key");
    req.lease_token = optional_str(v.or_none(P::lease_token), "lease_token");
    req.user = optional_str(v.or_none(P::user), "user");
    // A helper's answer: the text to send, or the failed result that refuses the call.
    py::object refused;
    const auto text_or_refusal = [&](const py::object& helper, PyObject* value, std::string& into,
                                     const char* what) -> bool {
      const py::object out =
          py::reinterpret_steal<py::object>(PyObject_CallFunctionObjArgs(helper.ptr(), v[P::aid], value, nullptr));
      if (!out) throw py::error_already_set();
      if (PyUnicode_Check(out.ptr())) {
        into = utf8(out.ptr(), what);
        return true;
      }
      refused = out;
      return false;
    };
    PyObject* inputs = v.or_none(P::inputs);
    std::optional<std::string> state_json;
    bool ready = true;
    if (PyUnicode_CheckExact(inputs))
      req.input_json = utf8(inputs, "inputs");
    else
      ready = text_or_refusal(self.input_text, inputs, req.input_json, "input_json");
    if (ready && v.given(P::state))
      ready = text_or_refusal(self.state_text, v[P::state], state_json.emplace(), "state");
    py::object result;
    bool ok = false;
    if (ready) {  // the timeout is looked at once the call can be sent, as on every transport
      if (v.given(P::timeout)) {
        const py::object ms =
            py::reinterpret_steal<py::object>(PyObject_CallOneArg(self.timeout_ms.ptr(), v[P::timeout]));
        if (!ms) return nullptr;
        req.timeout_ms = PyLong_AsLongLong(ms.ptr());
        if (*req.timeout_ms == -1 && PyErr_Occurred()) return nullptr;
      } else {
        req.timeout_ms = self.default_timeout_ms;
      }
      thread_local std::optional<CallerState> session;
      if (!session) session.emplace(/*respond_with_delta=*/true);
      const Response r = handle_in_process(self.tool_host->host(), req, *session,
                                           state_json ? std::optional<std::string_view>(*state_json) : std::nullopt);
      if (state_json || (r.ds_state.changes && !r.ds_state.changes->empty())) session.reset();  // the next starts empty
      result = results().make(py::reinterpret_borrow<py::object>(v[P::aid]), r);
      ok = r.ok();
      if (ok && v.given(P::state)) {
        const py::object applied = py::reinterpret_steal<py::object>(
            PyObject_CallFunctionObjArgs(self.apply_state.ptr(), v[P::state], result.ptr(), nullptr));
        if (!applied) return nullptr;
      }
    } else {
      result = refused;
    }
    if (check && !ok) {
      const py::object raised = py::reinterpret_steal<py::object>(PyObject_CallMethodNoArgs(result.ptr(), k_raise));
      if (!raised) return nullptr;  // the matching ToolhostError
    }
    return result.release().ptr();
  } catch (...) {
    return python_error();
  }
}

/// _core.encode_request: one request line (with its newline) for --serve, positional only.
PyObject* fast_encode_request(PyObject*, PyObject* const* args, Py_ssize_t nargs) noexcept {
  try {
    using A = RequestArgument;
    const Arguments<A> a = encode_request_layout().parse(args, nargs);
    const long long id = PyLong_AsLongLong(a[A::id]);
    if (id == -1 && PyErr_Occurred()) throw py::error_already_set();
    RequestFields call = request_from(a);
    call.request.front = kPythonFront;
    thread_local std::string out;
    out.clear();
    encode_request(call.request, id, call.ds_state_json.value_or(std::string_view()), out);
    return PyBytes_FromStringAndSize(out.data(), static_cast<Py_ssize_t>(out.size()));
  } catch (...) {
    return python_error();
  }
}

template <class F>
PyCFunction c_function(F* f) {
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(f));
}

}  // namespace

void bind_fast_calls(py::module_& m) {
  // The docstrings open with the text signatures made from the argument lists; the
  // method tables and their texts live as long as the module.
  static const std::string encode_doc =
      encode_request_layout().text_signature() + "\n--\n\nOne request line (with its newline) for --serve; bytes.";
  static const std::string call_doc =
      call_layout().text_signature() + "\n--\n\nOne call on the host in the given session; a ToolResult.";
  static const std::string inprocess_doc =
      transport_call().text_signature() + "Runs one tool call (see Transport.call).";
  static PyMethodDef methods[] = {
      {"encode_request", c_function(&fast_encode_request), METH_FASTCALL, encode_doc.c_str()},
      {"call", c_function(&fast_call), METH_FASTCALL, call_doc.c_str()},
      {nullptr, nullptr, 0, nullptr}};
  static PyMethodDef inprocess_method = {"call", c_function(&inprocess_call), METH_FASTCALL | METH_KEYWORDS,
                                         inprocess_doc.c_str()};
  if (PyModule_AddFunctions(m.ptr(), methods) != 0) throw py::error_already_set();
  // InProcess.call: bound like a Python function (an instance method of the class).
  py::object fn =
      py::reinterpret_steal<py::object>(PyCFunction_NewEx(&inprocess_method, nullptr, m.attr("__name__").ptr()));
  if (!fn) throw py::error_already_set();
  py::object method = py::reinterpret_steal<py::object>(PyInstanceMethod_New(fn.ptr()));
  if (!method) throw py::error_already_set();
  m.attr("_inprocess_call") = method;

  py::class_<InProcessState>(m, "InProcessState",
                             "What InProcess.call needs of an open InProcess transport (its `_fast`).")
      .def(py::init([](py::object host, std::int64_t default_timeout_ms, py::object input_text, py::object state_text,
                       py::object apply_state, py::object timeout_ms) {
             ToolHost* tool_host = &host.cast<ToolHost&>();
             return InProcessState{std::move(host),
                                   default_timeout_ms,
                                   std::move(input_text),
                                   std::move(state_text),
                                   std::move(apply_state),
                                   std::move(timeout_ms),
                                   tool_host};
           }),
           "host"_a, "default_timeout_ms"_a, "input_text"_a, "state_text"_a, "apply_state"_a, "timeout_ms"_a)
      .def_readonly("host", &InProcessState::host)
      .def_readonly("default_timeout_ms", &InProcessState::default_timeout_ms);
}

}  // namespace machina::binding
