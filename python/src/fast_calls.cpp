// The raw calls of the hot path, without pybind11's argument machinery: _core.call,
// _core.encode_request and InProcess.call.
#include "module_parts.hpp"
#include "py_convert.hpp"
#include "result_factory.hpp"

#include <machina/tool_host.hpp>
#include <machina/wire.hpp>
#include <machina/wire_client.hpp>

#include <optional>
#include <string>
#include <string_view>

namespace machina::binding {

namespace {

/// One in-process call: the host (which applies every rule to the request), with the GIL
/// released while it runs.
machina::Response handle_in_process(machina::Host& host, machina::Request& req, machina::Session& session,
                                    const std::optional<std::string>& ds_state_json) {
  if (ds_state_json) {
    machina::DsUpdate update;
    std::string why;
    if (!machina::decode_ds_state(*ds_state_json, update, why)) {
      return machina::Response::failure(machina::ErrorKind::invalid_ds_state, why);
    }
    req.ds_state = std::move(update);
  }
  py::gil_scoped_release release;
  return host.handle(req, session);
}

/// Host.call without pybind11's argument machinery (positional only): the raw binding.
/// _core.call(host, aid, input_json, session, idempotency_key, lease_token, timeout_ms, ds_state_json[, user])
PyObject* fast_call(PyObject*, PyObject* const* args, Py_ssize_t nargs) noexcept {
  try {
    if (nargs != 8 && nargs != 9) throw py::type_error("call() takes 8 or 9 positional arguments");
    auto& host = bound<machina::ToolHost>(args[0]).host();
    auto& session = bound<machina::Session>(args[3]);
    machina::Request req;
    req.front = machina::Front::python;
    req.aid = utf8(args[1], "aid");
    req.input_json = utf8(args[2], "input_json");
    req.idempotency_key = optional_str(args[4], "idempotency_key");
    req.lease_token = optional_str(args[5], "lease_token");
    if (args[6] != Py_None) {
      const long long ms = PyLong_AsLongLong(args[6]);
      if (ms == -1 && PyErr_Occurred()) throw py::error_already_set();
      req.timeout_ms = ms;
    }
    if (nargs == 9) req.user = optional_str(args[8], "user");
    const machina::Response r = handle_in_process(host, req, session, optional_str(args[7], "ds_state_json"));
    return results().make(py::reinterpret_borrow<py::object>(args[1]), r).release().ptr();
  } catch (...) {
    return python_error();
  }
}

/// InProcess.call, compiled: the one path of every in-process call. Bound to InProcess as
/// an instance method, so args[0] is the transport; `self._fast` is, while it is open,
/// (Host, default timeout_ms, input_text, state_text, apply_state, timeout_ms) — the
/// transport's Python helpers for what is not on the hot path (inputs that are not a str,
/// a state, a timeout of the call's own). Each call runs in an empty session: one per
/// thread, replaced when a call left something in it.
PyObject* inprocess_call(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) noexcept {
  static PyObject* const k_fast = PyUnicode_InternFromString("_fast");
  static PyObject* const k_raise = PyUnicode_InternFromString("raise_for_error");
  // Parameter names after self, in order; the first two may be positional.
  static PyObject* const names[] = {
      PyUnicode_InternFromString("aid"),         PyUnicode_InternFromString("inputs"),
      PyUnicode_InternFromString("state"),       PyUnicode_InternFromString("idempotency_key"),
      PyUnicode_InternFromString("lease_token"), PyUnicode_InternFromString("timeout"),
      PyUnicode_InternFromString("check"),       PyUnicode_InternFromString("user")};
  enum { aid_, inputs_, state_, key_, token_, timeout_, check_, user_, n_ };
  try {
    if (nargs > 3) {
      throw py::type_error("call() takes from 1 to 2 positional arguments but " + std::to_string(nargs - 1) +
                           " were given");
    }
    PyObject* v[n_] = {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
    for (Py_ssize_t i = 1; i < nargs; ++i) v[i - 1] = args[i];
    const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nkw; ++i) {
      PyObject* name = PyTuple_GET_ITEM(kwnames, i);
      int at = -1;
      for (int k = 0; k < n_ && at < 0; ++k) {
        if (name == names[k] || PyUnicode_Compare(name, names[k]) == 0) at = k;
      }
      if (at < 0)
        throw py::type_error("call() got an unexpected keyword argument '" + py::str(name).cast<std::string>() + "'");
      if (v[at] != nullptr)
        throw py::type_error("call() got multiple values for argument '" + py::str(name).cast<std::string>() + "'");
      v[at] = args[nargs + i];
    }
    if (v[aid_] == nullptr) throw py::type_error("call() missing 1 required positional argument: 'aid'");
    const auto given = [&](int k) { return v[k] != nullptr && v[k] != Py_None; };
    bool check = true;
    if (v[check_] != nullptr) {
      const int truth = PyObject_IsTrue(v[check_]);
      if (truth < 0) return nullptr;
      check = truth != 0;
    }
    const py::object info = py::reinterpret_steal<py::object>(PyObject_GetAttr(args[0], k_fast));
    if (!info) return nullptr;
    if (!PyTuple_CheckExact(info.ptr()) || PyTuple_GET_SIZE(info.ptr()) != 6) {  // None once closed
      PyErr_SetString(PyExc_RuntimeError, "the InProcess transport is closed");
      return nullptr;
    }
    PyObject* const* helpers = &PyTuple_GET_ITEM(info.ptr(), 0);
    auto& host = bound<machina::ToolHost>(helpers[0]).host();
    machina::Request req;
    req.front = machina::Front::python;
    req.aid = utf8(v[aid_], "aid");
    req.idempotency_key = optional_str(given(key_) ? v[key_] : Py_None, "idempotency_key");
    req.lease_token = optional_str(given(token_) ? v[token_] : Py_None, "lease_token");
    req.user = optional_str(given(user_) ? v[user_] : Py_None, "user");
    // A helper's answer: the text to send, or the failed result that refuses the call.
    py::object refused;
    const auto text_or_refusal = [&](PyObject* helper, PyObject* value, std::string& into, const char* what) -> bool {
      const py::object out =
          py::reinterpret_steal<py::object>(PyObject_CallFunctionObjArgs(helper, v[aid_], value, nullptr));
      if (!out) throw py::error_already_set();
      if (PyUnicode_Check(out.ptr())) {
        into = utf8(out.ptr(), what);
        return true;
      }
      refused = out;
      return false;
    };
    PyObject* inputs = v[inputs_] != nullptr ? v[inputs_] : Py_None;
    std::optional<std::string> state_json;
    bool ready = true;
    if (PyUnicode_CheckExact(inputs))
      req.input_json = utf8(inputs, "inputs");
    else
      ready = text_or_refusal(helpers[2], inputs, req.input_json, "input_json");
    if (ready && given(state_)) ready = text_or_refusal(helpers[3], v[state_], state_json.emplace(), "state");
    py::object result;
    bool ok = false;
    if (ready) {  // the timeout is looked at once the call can be sent, as on every transport
      const py::object ms = given(timeout_)
                                ? py::reinterpret_steal<py::object>(PyObject_CallOneArg(helpers[5], v[timeout_]))
                                : py::reinterpret_borrow<py::object>(helpers[1]);
      if (!ms) return nullptr;
      req.timeout_ms = PyLong_AsLongLong(ms.ptr());
      if (*req.timeout_ms == -1 && PyErr_Occurred()) return nullptr;
      thread_local std::optional<machina::Session> session;
      if (!session) session.emplace(/*respond_with_delta=*/true);
      const machina::Response r = handle_in_process(host, req, *session, state_json);
      if (state_json || (r.ds_state.changes && !r.ds_state.changes->empty())) session.reset();  // the next starts empty
      result = results().make(py::reinterpret_borrow<py::object>(v[aid_]), r);
      ok = r.ok();
      if (ok && given(state_)) {
        const py::object applied = py::reinterpret_steal<py::object>(
            PyObject_CallFunctionObjArgs(helpers[4], v[state_], result.ptr(), nullptr));
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

PyMethodDef kInProcessCall = {
    "call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&inprocess_call)), METH_FASTCALL | METH_KEYWORDS,
    "call($self, aid, inputs=None, *, state=None, idempotency_key=None, lease_token=None, timeout=None, check=True, "
    "user=None)\n"
    "--\n\n"
    "Runs one tool call (see Transport.call)."};

/// _core.encode_request(id, aid, input_json, idempotency_key=None, lease_token=None,
/// timeout_ms=None, ds_state_json=None, user=None) -> bytes, positional only: one request
/// line (with its newline) for --serve. Raw, as the pool encodes one per call.
PyObject* fast_encode_request(PyObject*, PyObject* const* args, Py_ssize_t nargs) noexcept {
  try {
    if (nargs < 3 || nargs > 8) throw py::type_error("encode_request() takes 3 to 8 positional arguments");
    auto arg = [&](Py_ssize_t i) { return i < nargs ? args[i] : Py_None; };
    const long long id = PyLong_AsLongLong(args[0]);
    if (id == -1 && PyErr_Occurred()) throw py::error_already_set();
    machina::Request req;
    req.front = machina::Front::python;
    req.aid = utf8(args[1], "aid");
    req.input_json = utf8(args[2], "input_json");
    req.idempotency_key = optional_str(arg(3), "idempotency_key");
    req.lease_token = optional_str(arg(4), "lease_token");
    req.user = optional_str(arg(7), "user");
    if (arg(5) != Py_None) {
      const long long ms = PyLong_AsLongLong(arg(5));
      if (ms == -1 && PyErr_Occurred()) throw py::error_already_set();
      req.timeout_ms = ms;
    }
    std::string_view state;
    if (arg(6) != Py_None) {
      Py_ssize_t n = 0;
      const char* p = PyUnicode_AsUTF8AndSize(arg(6), &n);
      if (p == nullptr) throw py::type_error("ds_state_json must be a str or None");
      state = std::string_view(p, static_cast<std::size_t>(n));
    }
    thread_local std::string out;
    out.clear();
    machina::encode_request(req, id, state, out);
    return PyBytes_FromStringAndSize(out.data(), static_cast<Py_ssize_t>(out.size()));
  } catch (...) {
    return python_error();
  }
}

PyMethodDef kFastMethods[] = {
    {"encode_request", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&fast_encode_request)), METH_FASTCALL,
     "encode_request(id, aid, input_json, idempotency_key=None, lease_token=None, timeout_ms=None, "
     "ds_state_json=None, user=None, /) -> bytes: one request line (with its newline) for --serve"},
    {"call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&fast_call)), METH_FASTCALL,
     "call(host, aid, input_json, session, idempotency_key, lease_token, timeout_ms, ds_state_json, user=None) -> "
     "ToolResult"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

void bind_fast_calls(py::module_& m) {
  if (PyModule_AddFunctions(m.ptr(), kFastMethods) != 0) throw py::error_already_set();
  // InProcess.call: bound like a Python function (an instance method of the class).
  py::object fn =
      py::reinterpret_steal<py::object>(PyCFunction_NewEx(&kInProcessCall, nullptr, m.attr("__name__").ptr()));
  if (!fn) throw py::error_already_set();
  py::object method = py::reinterpret_steal<py::object>(PyInstanceMethod_New(fn.ptr()));
  if (!method) throw py::error_already_set();
  m.attr("_inprocess_call") = method;
}

}  // namespace machina::binding
