// machina_dispatch._core: the C++ host in-process. Only converts types; every rule
// lives in the core, where the CLI uses it too.
#include <machina/child_process.hpp>
#include <machina/host.hpp>
#include <machina/policy.hpp>
#include <machina/http_client.hpp>
#include <machina/json_text.hpp>
#include <machina/lease.hpp>
#include <machina/ndjson_front.hpp>
#include <machina/tool_list.hpp>
#include <machina/tool_names.hpp>
#include <machina/spin_wait.hpp>
#include <machina/wire.hpp>
#include <machina/wire_client.hpp>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <array>
#include <cerrno>
#include <chrono>
#include <memory>
#include <optional>
#include <unordered_map>

namespace py = pybind11;
using namespace py::literals;

namespace {

/// The keyword options of Host(): each sets one field of the core's HostOptions, whose
/// own defaults (HostOptions{}, with the environment's, see HostOptions::from_env) are the
/// defaults; an option not given is left as it is.
using OptionSetter = void (*)(machina::HostOptions&, py::handle);
template <class T>
T as(py::handle v, const char* name, const char* what) {
  try {
    return v.cast<T>();
  } catch (const py::cast_error&) {
    throw py::type_error(std::string("Host option '") + name + "' must be " + what + ", not " +
                         std::string(py::str(py::type::of(v).attr("__name__"))));
  }
}
const std::vector<std::pair<const char*, OptionSetter>>& host_options() {
  using O = machina::HostOptions;
  static const std::vector<std::pair<const char*, OptionSetter>> table = {
      {"max_request_bytes", [](O& o, py::handle v) { o.max_request_bytes = as<std::size_t>(v, "max_request_bytes", "an int"); }},
      {"max_output_bytes", [](O& o, py::handle v) { o.max_output_bytes = as<std::size_t>(v, "max_output_bytes", "an int"); }},
      {"idempotency_ttl_ms", [](O& o, py::handle v) { o.idempotency.ttl_ms = as<std::int64_t>(v, "idempotency_ttl_ms", "an int"); }},
      {"idempotency_max_entries", [](O& o, py::handle v) { o.idempotency.max_entries = as<std::size_t>(v, "idempotency_max_entries", "an int"); }},
      {"idempotency_max_key_bytes", [](O& o, py::handle v) { o.idempotency.max_key_bytes = as<std::size_t>(v, "idempotency_max_key_bytes", "an int"); }},
      {"idempotency_max_bytes", [](O& o, py::handle v) { o.idempotency.max_stored_bytes = as<std::size_t>(v, "idempotency_max_bytes", "an int"); }},
      {"breaker_threshold", [](O& o, py::handle v) { o.breaker.threshold = as<std::uint32_t>(v, "breaker_threshold", "an int"); }},
      {"breaker_window_ms", [](O& o, py::handle v) { o.breaker.window_ms = as<std::int64_t>(v, "breaker_window_ms", "an int"); }},
      {"breaker_cooldown_ms", [](O& o, py::handle v) { o.breaker.cooldown_ms = as<std::int64_t>(v, "breaker_cooldown_ms", "an int"); }},
      {"timeout_ms", [](O& o, py::handle v) { o.default_timeout_ms = as<std::int64_t>(v, "timeout_ms", "an int"); }},
      {"max_timeout_ms", [](O& o, py::handle v) { o.max_timeout_ms = as<std::int64_t>(v, "max_timeout_ms", "an int"); }},
      {"tool_timeouts_ms", [](O& o, py::handle v) {
         for (const auto& [aid, ms] : as<std::map<std::string, std::int64_t>>(v, "tool_timeouts_ms", "a dict of aid to int")) {
           o.tool_timeouts_ms[aid] = ms;
         }
       }},
      {"max_stuck_calls", [](O& o, py::handle v) { o.max_stuck_calls = as<std::size_t>(v, "max_stuck_calls", "an int"); }},
      {"isolation", [](O& o, py::handle v) {
         const auto mode = as<std::string>(v, "isolation", "a str");
         if (mode == "process") o.isolation = machina::Isolation::process;
         else if (mode == "inline") o.isolation = machina::Isolation::inline_threads;
         else throw machina::HostError("isolation must be 'inline' or 'process', not '" + mode + "'");
       }},
      {"worker_executable", [](O& o, py::handle v) { o.workers.executable = as<std::string>(v, "worker_executable", "a str"); }},
      {"isolation_workers", [](O& o, py::handle v) { o.workers.size = as<std::size_t>(v, "isolation_workers", "an int"); }},
      {"limit_cpu_s", [](O& o, py::handle v) { o.workers.limits.cpu_seconds = as<std::uint64_t>(v, "limit_cpu_s", "an int"); }},
      {"limit_memory_mb", [](O& o, py::handle v) { o.workers.limits.address_space_mb = as<std::uint64_t>(v, "limit_memory_mb", "an int"); }},
      {"limit_open_files", [](O& o, py::handle v) { o.workers.limits.open_files = as<std::uint64_t>(v, "limit_open_files", "an int"); }},
      {"limit_file_size_mb", [](O& o, py::handle v) { o.workers.limits.file_size_mb = as<std::uint64_t>(v, "limit_file_size_mb", "an int"); }},
      {"no_network", [](O& o, py::handle v) { o.workers.limits.no_network = as<bool>(v, "no_network", "a bool"); }},
      {"worker_env", [](O& o, py::handle v) { o.workers.pass_env = as<std::vector<std::string>>(v, "worker_env", "a list of str"); }},
      {"python_workers", [](O& o, py::handle v) { o.python_workers = as<std::size_t>(v, "python_workers", "an int"); }},
      {"python_memory_mb", [](O& o, py::handle v) { o.python_memory_mb = as<std::uint64_t>(v, "python_memory_mb", "an int"); }},
      {"skill_tick_ms", [](O& o, py::handle v) { o.skill_tick_ms = as<std::int64_t>(v, "skill_tick_ms", "an int"); }},
      {"audit_db", [](O& o, py::handle v) { o.audit.db_path = as<std::string>(v, "audit_db", "a str"); }},
      {"audit_jsonl", [](O& o, py::handle v) { o.audit.jsonl_path = as<std::string>(v, "audit_jsonl", "a str"); }},
      {"audit_retention_days", [](O& o, py::handle v) { o.audit.retention_days = as<std::int64_t>(v, "audit_retention_days", "an int"); }},
      {"audit_max_rows", [](O& o, py::handle v) { o.audit.max_rows = as<std::int64_t>(v, "audit_max_rows", "an int"); }},
      {"audit_required", [](O& o, py::handle v) { o.audit.required = machina::parse_audit_required(as<std::string>(v, "audit_required", "a str")); }},
  };
  return table;
}

machina::Front front_named(const std::string& name) {
  for (auto f : {machina::Front::run, machina::Front::serve, machina::Front::mcp, machina::Front::skill,
                 machina::Front::http, machina::Front::python, machina::Front::nats}) {
    if (machina::front_name(f) == name) return f;
  }
  throw machina::HostError("unknown front '" + name + "' (run, serve, mcp, skill, http, python, nats)");
}

machina::HostOptions make_options(const py::kwargs& kwargs) {
  machina::HostOptions o = machina::HostOptions::from_env();
  const auto& table = host_options();
  for (const auto& [key, value] : kwargs) {
    const std::string name = py::str(key);
    auto it = std::find_if(table.begin(), table.end(), [&](const auto& entry) { return name == entry.first; });
    if (it == table.end()) {
      std::string known;
      for (const auto& entry : table) known += std::string(known.empty() ? "" : ", ") + entry.first;
      throw py::type_error("Host() got an unexpected keyword argument '" + name + "' (options: " + known + ")");
    }
    if (!value.is_none()) it->second(o, value);
  }
  return o;
}

/// Builds result objects of the Python result class (a tuple subclass registered by
/// machina_dispatch) straight from a core Response. Strings that repeat (statuses,
/// codes, kinds) are made once.
class ResultFactory {
 public:
  static constexpr std::size_t kFields = 11;  // see machina_dispatch._result.ToolResult

  void configure(py::type cls, const py::dict& kinds) {
    cls_ = std::move(cls);
    for (const auto& info : machina::all_error_kinds()) {
      const std::string code(info.code);
      codes_[index(info.kind)] = py::str(code);
      kinds_[index(info.kind)] = kinds.contains(code) ? py::reinterpret_borrow<py::object>(kinds[code.c_str()])
                                                      : py::object(py::str(code));
      statuses_[index(info.kind)] = py::str(std::string(machina::status_name(info.status)));
    }
    statuses_[0] = py::str("OK");
    empty_ = py::str("");
    for (const auto& info : machina::all_error_kinds()) by_code_.emplace(std::string(info.code), index(info.kind));
  }

  /// From a response read off the wire: the same object the in-process call makes.
  /// Throws ValueError (py::value_error) for a code this build does not know.
  py::object make(const py::object& aid, const machina::ResponseFields& f) const {
    PyObject* obj = alloc();
    py::object result = py::reinterpret_steal<py::object>(obj);
    std::size_t k = 0;
    if (!f.ok) {
      auto it = f.code ? by_code_.find(*f.code) : by_code_.end();
      // Not a response this build can read (a host of another version?): ValueError, as
      // for any unreadable response, so that the readers fail the stream the same way.
      if (it == by_code_.end()) {
        throw py::value_error("unknown error code '" + (f.code ? *f.code : std::string("(none)")) + "' in a response");
      }
      k = it->second;
    }
    set(obj, 0, aid);
    set(obj, 1, py::bool_(f.ok));
    set(obj, 2, f.status ? (k == 0 ? py::object(py::str(*f.status)) : statuses_[k])
                         : py::object(py::none()));
    set(obj, 3, f.output_json.empty() ? empty_ : py::object(py::str(f.output_json)));
    set(obj, 4, f.error.empty() ? empty_ : py::object(py::str(f.error)));
    set(obj, 5, f.ok ? py::object(py::none()) : codes_[k]);
    set(obj, 6, f.ok ? py::object(py::none()) : kinds_[k]);
    set(obj, 7, py::bool_(f.idempotent_hit));
    if (f.ds_state.empty()) set(obj, 8, py::none());
    else if (f.ds_state == kEmptyDelta) set(obj, 8, empty_);
    else set(obj, 8, py::str(std::string(f.ds_state)));
    py::object details = py::none();
    if (f.lease_tier || f.lease_aid) {
      details = py::dict("tier"_a = f.lease_tier.value_or(-1), "aid"_a = f.lease_aid.value_or(""));
    } else if (f.lease_reason) {
      details = py::dict("reason"_a = *f.lease_reason);
    }
    if (f.hint) {
      if (details.is_none()) details = py::dict();
      details["hint"] = *f.hint;
    }
    set(obj, 9, details);
    set(obj, 10, f.trace.empty() ? py::object(py::none()) : py::object(py::str(std::string(f.trace))));
    untrack_if_acyclic(obj);
    return result;
  }

  py::object make(const py::object& aid, const machina::Response& r) const {
    PyObject* obj = alloc();
    py::object result = py::reinterpret_steal<py::object>(obj);
    const std::size_t k = index(r.kind);
    const bool call_response = machina::error_info(r.kind).call_response;
    set(obj, 0, aid);
    set(obj, 1, py::bool_(r.ok()));
    set(obj, 2, statuses_[k]);
    set(obj, 3, r.output_json.empty() ? empty_ : py::object(py::str(r.output_json)));
    set(obj, 4, r.error.empty() ? empty_ : py::object(py::str(r.error)));
    set(obj, 5, r.ok() ? py::object(py::none()) : codes_[k]);
    set(obj, 6, r.ok() ? py::object(py::none()) : kinds_[k]);
    set(obj, 7, py::bool_(r.idempotent_hit));
    if (!call_response) {
      set(obj, 8, py::none());
    } else if (r.ds_state.mode == machina::DsReport::Mode::delta && (!r.ds_state.changes || r.ds_state.changes->empty())) {
      set(obj, 8, empty_);  // the common case: no change
    } else {
      std::string ds;
      machina::encode_ds_state(r.ds_state, ds);
      set(obj, 8, py::str(ds));
    }
    py::object details = py::none();
    if (r.kind == machina::ErrorKind::lease_required) {
      details = py::dict("tier"_a = r.lease_tier, "aid"_a = r.lease_aid);
    } else if (r.kind == machina::ErrorKind::lease_rejected) {
      details = py::dict("reason"_a = r.lease_reason);
    }
    if (!r.hint.empty()) {
      if (details.is_none()) details = py::dict();
      details["hint"] = r.hint;
    }
    set(obj, 9, details);
    set(obj, 10, r.trace_json.empty() ? py::object(py::none()) : py::object(py::str(r.trace_json)));
    untrack_if_acyclic(obj);
    return result;
  }

 private:
  static constexpr std::string_view kEmptyDelta = R"({"delta":true,"slots":{},"removed_slots":[]})";

  PyObject* alloc() const {
    if (!cls_) throw std::runtime_error("machina_dispatch._core: result class not configured");
    auto* type = reinterpret_cast<PyTypeObject*>(cls_.ptr());
    PyObject* obj = type->tp_alloc(type, static_cast<Py_ssize_t>(kFields));
    if (obj == nullptr) throw py::error_already_set();
    return obj;
  }
  // A result holds strings, bools and None, plus the `details` dict on some failures:
  // without that dict it can never be part of a reference cycle (the class has no
  // __dict__), so the cycle collector need not track it. Results are made by the
  // hundred thousand in a batch, and every tracked one is scanned again by each
  // collection the batch's allocations set off: untracked, a pipelined batch runs about
  // half again as fast.
  static void untrack_if_acyclic(PyObject* obj) {
    if (PyTuple_GET_ITEM(obj, 9) == Py_None && PyObject_GC_IsTracked(obj)) PyObject_GC_UnTrack(obj);
  }
  static std::size_t index(machina::ErrorKind kind) { return static_cast<std::size_t>(kind); }
  static void set(PyObject* tuple, Py_ssize_t i, const py::object& value) {
    PyTuple_SET_ITEM(tuple, i, value.inc_ref().ptr());
  }

  static constexpr std::size_t kKinds = std::tuple_size_v<std::remove_cvref_t<decltype(machina::all_error_kinds())>> + 1;
  py::object cls_;
  std::array<py::object, kKinds> codes_, kinds_, statuses_;
  py::object empty_;
  std::unordered_map<std::string, std::size_t> by_code_;
};

/// Appends the request line of one pooled call.
void encode_call(std::int64_t id, std::string aid, std::string input_json, std::optional<std::string> key,
                 std::optional<std::string> token, std::optional<std::int64_t> timeout_ms,
                 const std::optional<std::string>& ds_state_json, std::optional<std::string> user, std::string& out) {
  machina::Request r;
  r.aid = std::move(aid);
  r.input_json = std::move(input_json);
  r.idempotency_key = std::move(key);
  r.lease_token = std::move(token);
  r.timeout_ms = timeout_ms;
  r.user = std::move(user);
  machina::encode_request(r, id, ds_state_json ? std::string_view(*ds_state_json) : std::string_view(), out);
}

ResultFactory& results() {
  static ResultFactory* factory = new ResultFactory();  // never destroyed: outlives the interpreter's teardown
  return *factory;
}

/// The C++ object behind a bound instance. pybind11's cast checks the type through its
/// registry on every call; here the Python types already seen to hold a T are remembered
/// (the registry still decides the first time for each type).
template <class T>
T& bound(PyObject* o) {
  static std::array<PyTypeObject*, 8> known{};
  PyTypeObject* type = Py_TYPE(o);
  for (PyTypeObject* t : known) {
    if (t == type) return *static_cast<T*>(reinterpret_cast<py::detail::instance*>(o)->get_value_and_holder().value_ptr());
    if (t == nullptr) break;
  }
  T& value = py::cast<T&>(py::handle(o));
  for (PyTypeObject*& t : known) {
    if (t == nullptr) {
      t = type;
      break;
    }
  }
  return value;
}

std::optional<std::string> optional_str(PyObject* o, const char* what) {
  if (o == Py_None) return std::nullopt;
  Py_ssize_t n = 0;
  const char* p = PyUnicode_AsUTF8AndSize(o, &n);
  if (p == nullptr) throw py::type_error(std::string(what) + " must be a str or None");
  return std::string(p, static_cast<std::size_t>(n));
}

std::string utf8(PyObject* o, const char* what) {
  Py_ssize_t n = 0;
  const char* p = PyUnicode_AsUTF8AndSize(o, &n);
  if (p == nullptr) throw py::type_error(std::string(what) + " must be a str");
  return std::string(p, static_cast<std::size_t>(n));
}

/// The Python error for the exception being handled (call from a catch block).
PyObject* python_error() noexcept {
  try {
    throw;
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const py::builtin_exception& e) {  // type_error, value_error, cast_error
    e.set_error();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

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
    auto& host = bound<machina::Host>(args[0]);
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
  static PyObject* const names[] = {PyUnicode_InternFromString("aid"),          PyUnicode_InternFromString("inputs"),
                                    PyUnicode_InternFromString("state"),        PyUnicode_InternFromString("idempotency_key"),
                                    PyUnicode_InternFromString("lease_token"),  PyUnicode_InternFromString("timeout"),
                                    PyUnicode_InternFromString("check"),        PyUnicode_InternFromString("user")};
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
      if (at < 0) throw py::type_error("call() got an unexpected keyword argument '" + py::str(name).cast<std::string>() + "'");
      if (v[at] != nullptr) throw py::type_error("call() got multiple values for argument '" + py::str(name).cast<std::string>() + "'");
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
    auto& host = bound<machina::Host>(helpers[0]);
    machina::Request req;
    req.front = machina::Front::python;
    req.aid = utf8(v[aid_], "aid");
    req.idempotency_key = optional_str(given(key_) ? v[key_] : Py_None, "idempotency_key");
    req.lease_token = optional_str(given(token_) ? v[token_] : Py_None, "lease_token");
    req.user = optional_str(given(user_) ? v[user_] : Py_None, "user");
    // A helper's answer: the text to send, or the failed result that refuses the call.
    py::object refused;
    const auto text_or_refusal = [&](PyObject* helper, PyObject* value, std::string& into, const char* what) -> bool {
      const py::object out = py::reinterpret_steal<py::object>(PyObject_CallFunctionObjArgs(helper, v[aid_], value, nullptr));
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
    if (PyUnicode_CheckExact(inputs)) req.input_json = utf8(inputs, "inputs");
    else ready = text_or_refusal(helpers[2], inputs, req.input_json, "input_json");
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
    {"encode_request", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&fast_encode_request)),
     METH_FASTCALL,
     "encode_request(id, aid, input_json, idempotency_key=None, lease_token=None, timeout_ms=None, "
     "ds_state_json=None, user=None, /) -> bytes: one request line (with its newline) for --serve"},
    {"call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&fast_call)), METH_FASTCALL,
     "call(host, aid, input_json, session, idempotency_key, lease_token, timeout_ms, ds_state_json, user=None) -> "
     "ToolResult"},
    {nullptr, nullptr, 0, nullptr}};

machina::ChildSpec child_spec(const std::string& executable, const std::vector<std::string>& argv,
                              const std::optional<std::vector<std::string>>& env, std::size_t tail_bytes) {
  machina::ChildSpec spec;
  spec.executable = executable;
  spec.argv = argv;
  spec.inherit_env = !env.has_value();
  if (env) spec.env = *env;
  spec.tail_bytes = tail_bytes;
  return spec;
}

[[noreturn]] void raise_start_error(const machina::StartError& e, const std::string& executable) {
  errno = e.error;
  PyErr_SetFromErrnoWithFilename(PyExc_OSError, executable.c_str());
  throw py::error_already_set();
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  machina::http::use_system_resolver();  // (names of HTTP tool services)
  machina::http::use_tls();              // (https tool services)
  if (PyModule_AddFunctions(m.ptr(), kFastMethods) != 0) throw py::error_already_set();
  {
    // InProcess.call: bound like a Python function (an instance method of the class).
    py::object fn = py::reinterpret_steal<py::object>(PyCFunction_NewEx(&kInProcessCall, nullptr, m.attr("__name__").ptr()));
    if (!fn) throw py::error_already_set();
    py::object method = py::reinterpret_steal<py::object>(PyInstanceMethod_New(fn.ptr()));
    if (!method) throw py::error_already_set();
    m.attr("_inprocess_call") = method;
  }
  m.doc() = "The machina-toolhost C++ host, in-process.";
  m.attr("__version__") = MACHINA_VERSION;
  m.attr("MAX_REQUEST_BYTES") = machina::kMaxRequestBytes;
  m.attr("MAX_OUTPUT_BYTES") = machina::kMaxOutputBytes;
  m.attr("BUILTIN_PLUGIN_FILE") = std::string(machina::kBuiltinPluginFile);

  // machina::HostError becomes machina_dispatch.HostError (a ToolhostError), once the
  // package has named it (_configure_errors); a RuntimeError before that.
  static PyObject* host_error = PyExc_RuntimeError;
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const machina::HostError& e) {
      PyErr_SetString(host_error, e.what());
    }
  });
  m.def(
      "_configure_errors",
      [](py::type cls) {
        if (!PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(cls.ptr()), reinterpret_cast<PyTypeObject*>(PyExc_Exception)))
          throw py::type_error("HostError must be an exception class");
        host_error = cls.inc_ref().ptr();  // kept for the life of the process
      },
      "cls"_a, "Names the exception class raised for the host's set-up errors.");

  m.def(
      "llm_function_names",
      [](const std::vector<std::string>& aids) {
        return machina::llm_function_names(std::vector<std::string_view>(aids.begin(), aids.end()));
      },
      "aids"_a, "The function names the LLM formats declare these aids under, one each (tool_names.hpp).");
  m.def(
      "advertised_input_schema",
      [](std::string_view schema_json) { return machina::advertised_input_schema(schema_json).dump(); },
      "schema_json"_a, "The input schema, as JSON text, a tool declaring this one is advertised with (tool_names.hpp).");
  m.def(
      "host_options",
      [] {
        py::list names;
        for (const auto& entry : host_options()) names.append(entry.first);
        return names;
      },
      "The keyword options Host() takes.");
  m.def(
      "error_kinds",
      [] {
        py::list out;
        for (const auto& k : machina::all_error_kinds()) {
          out.append(py::make_tuple(std::string(k.code), std::string(machina::status_name(k.status)),
                                    k.counts_for_breaker, std::string(k.error_type)));
        }
        return out;
      },
      "Every error kind as (code, status, counts_for_breaker, error_type), in the core's order.");

  // Child processes: machina::ChildProcess, the one supervisor (the pool's --serve hosts,
  // the spawn transport's --run hosts). Without `env` a child gets this process's
  // environment as the C library has it (os.environ writes through to it); converting
  // os.environ costs more than the spawn. A child that cannot be started raises OSError
  // (FileNotFoundError, PermissionError, ...) naming the file.
  py::class_<machina::ChildProcess>(m, "ChildProcess",
                                    "A child process with stdin and stdout pipes for the caller, its stderr "
                                    "drained into a bounded tail (see machina_dispatch._process).")
      .def(py::init([](const std::string& executable, const std::vector<std::string>& argv,
                       const std::optional<std::vector<std::string>>& env, std::size_t tail_bytes) {
             machina::ChildSpec spec = child_spec(executable, argv, env, tail_bytes);
             spec.stdio = machina::ChildSpec::Stdio::pipes;
             std::unique_ptr<machina::ChildProcess> child;
             try {
               py::gil_scoped_release release;
               child = std::make_unique<machina::ChildProcess>(spec);
               child->drain_in_background();
             } catch (const machina::StartError& e) {
               raise_start_error(e, executable);
             }
             return child;
           }),
           "executable"_a, "argv"_a, "env"_a = py::none(), "tail_bytes"_a = 4096)
      .def_property_readonly("pid", &machina::ChildProcess::pid)
      .def_property_readonly("input_fd", &machina::ChildProcess::input_fd, "Non-blocking write end of its stdin.")
      .def_property_readonly("stdout_fd", &machina::ChildProcess::stdout_fd, "Non-blocking read end of its stdout.")
      .def_property_readonly("exit_code", &machina::ChildProcess::exit_code,
                             "After end(): its exit status, or -N for signal N.")
      .def("tail", &machina::ChildProcess::tail, "The tail of its stderr.")
      .def("close_input", &machina::ChildProcess::close_input, "End of its input (the descriptor number stays taken).")
      .def("exited", &machina::ChildProcess::exited, "Whether it has exited (not reaped).")
      .def(
          "wait_exit",
          [](const machina::ChildProcess& c, double timeout_s) {
            py::gil_scoped_release release;
            return c.wait_exit(std::chrono::milliseconds(static_cast<std::int64_t>(std::max(0.0, timeout_s) * 1000)));
          },
          "timeout_s"_a, "Waits up to timeout_s for it to exit (not reaping it); whether it has.")
      .def("kill", &machina::ChildProcess::kill, "SIGKILL to its process group and to it.")
      .def(
          "end",
          [](machina::ChildProcess& c, double drain_s) {
            py::gil_scoped_release release;
            return c.end(static_cast<int>(std::max(0.0, drain_s) * 1000));
          },
          "drain_s"_a = 1.0,
          "Kills its group, reaps it, reads the last of its stderr; returns how it ended.");

  m.def(
      "run_to_completion",
      [](const std::string& executable, const std::vector<std::string>& argv,
         const std::optional<std::vector<std::string>>& env, const py::bytes& input, double timeout_s,
         std::size_t max_stdout, std::size_t tail_bytes) {
        const machina::ChildSpec spec = child_spec(executable, argv, env, tail_bytes);
        const std::string_view in = input;
        machina::ChildOutcome r;
        try {
          py::gil_scoped_release release;
          r = machina::run_to_completion(
              spec, in, std::chrono::milliseconds(static_cast<std::int64_t>(std::max(0.0, timeout_s) * 1000)),
              max_stdout);
        } catch (const machina::StartError& e) {
          raise_start_error(e, executable);
        }
        static const char* const names[] = {"exited", "timed_out", "output_over_cap"};
        return py::make_tuple(names[static_cast<int>(r.ended)], py::bytes(r.stdout_text), r.exit_code, r.how,
                              r.tail);
      },
      "executable"_a, "argv"_a, "env"_a, "input"_a, "timeout_s"_a, "max_stdout"_a, "tail_bytes"_a = 4096,
      "Runs a child to completion (machina::run_to_completion): returns (ended, stdout, exit_code, how, "
      "stderr_tail), ended being 'exited', 'timed_out' or 'output_over_cap'.");

  m.def(
      "round_trip",
      [](int fd_in, int fd_out, const py::bytes& line, double timeout_s, const py::object& write_lock,
         std::int64_t spin_us, std::int64_t id, const py::object& aid) {
        // The pool's lone caller (machina::round_trip, with the GIL released). `write_lock`
        // (held by the caller) is released as soon as the writing ends. Returns (bytes
        // written, bytes read, status, result): status 0 done, 1 end of output, 2 out of
        // time, 3 the write failed. When what was read is exactly one response line,
        // answering `id`, it comes decoded as `result` (for `aid`) and no bytes are returned;
        // anything else is left to the pool's general reader (result None).
        char* out = nullptr;
        Py_ssize_t out_size = 0;
        if (PyBytes_AsStringAndSize(line.ptr(), &out, &out_size) != 0) throw py::error_already_set();
        machina::RoundTrip rt;
        {
          py::gil_scoped_release release;
          const auto until = std::chrono::steady_clock::now() +
                             std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                 std::chrono::duration<double>(std::max(timeout_s, 0.0)));
          rt = machina::round_trip(fd_in, fd_out, std::string_view(out, static_cast<std::size_t>(out_size)), until,
                                   std::chrono::microseconds(spin_us), [&] {
                                     py::gil_scoped_acquire gil;
                                     write_lock.attr("release")();
                                   });
        }
        const int status = static_cast<int>(rt.status);
        const std::string& data = rt.data;
        if (rt.status == machina::RoundTrip::Status::done && id >= 0 && data.size() > 1 &&
            data.find('\n') == data.size() - 1) {
          machina::ResponseFields fields;
          std::string why;
          if (machina::decode_response(std::string_view(data).substr(0, data.size() - 1), fields, why) &&
              fields.id == id) {
            try {
              return py::make_tuple(rt.written, py::bytes(), status, results().make(aid, fields));
            } catch (const py::value_error&) {
              // (an error code this build does not know: the general reader reports it)
            }
          }
        }
        return py::make_tuple(rt.written, py::bytes(data), status, py::object(py::none()));
      },
      "fd_in"_a, "fd_out"_a, "line"_a, "timeout_s"_a, "write_lock"_a, "spin_us"_a = 0, "id"_a = -1,
      "aid"_a = py::none(),
      "One pooled call's write and first read (see the pool).");
  m.def(
      "encode_requests",
      [](const py::list& calls) {
        // Each item: (id, aid, input_json, idempotency_key, lease_token, timeout_ms, ds_state_json, user).
        std::string out;
        out.reserve(calls.size() * 64);
        for (const py::handle item : calls) {
          const auto t = item.cast<py::tuple>();
          encode_call(t[0].cast<std::int64_t>(), t[1].cast<std::string>(), t[2].cast<std::string>(),
                      t[3].cast<std::optional<std::string>>(), t[4].cast<std::optional<std::string>>(),
                      t[5].cast<std::optional<std::int64_t>>(), t[6].cast<std::optional<std::string>>(),
                      t.size() > 7 ? t[7].cast<std::optional<std::string>>() : std::nullopt, out);
        }
        return py::bytes(out);
      },
      "calls"_a, "Request lines for many calls at once.");
  m.def(
      "decode_responses",
      [](const py::bytes& data, std::size_t start, const py::dict& aids) {
        // machina::match_responses over `aids`, which maps each open id to its aid in
        // sending order: [(id, result)], and where the next line starts. ValueError if the
        // stream can no longer be trusted.
        struct Open final : machina::OpenRequests {
          const py::dict& aids;
          explicit Open(const py::dict& a) : aids(a) {}
          bool is_open(std::int64_t id) const override { return aids.contains(py::int_(id)); }
          void oldest_first(const std::function<bool(std::int64_t)>& visit) const override {
            for (const auto& item : aids) {
              if (!visit(item.first.cast<std::int64_t>())) return;
            }
          }
        } open(aids);
        char* buf = nullptr;
        Py_ssize_t size = 0;
        if (PyBytes_AsStringAndSize(data.ptr(), &buf, &size) != 0) throw py::error_already_set();
        py::list out;
        std::size_t next = 0;
        try {
          next = machina::match_responses(std::string_view(buf, static_cast<std::size_t>(size)), start, open,
                                          [&](std::int64_t id, const machina::ResponseFields& fields) {
                                            const py::int_ key(id);
                                            out.append(py::make_tuple(key, results().make(py::object(aids[key]), fields)));
                                          });
        } catch (const machina::StreamError& e) {
          throw py::value_error(e.what());
        }
        return py::make_tuple(out, next);
      },
      "data"_a, "start"_a, "aids"_a, "Decodes the complete response lines in data[start:].");
  m.def(
      "decode_response",
      [](const py::bytes& line, const py::str& aid) {
        // One response (as --run writes it) for the call to `aid`. ValueError if unreadable.
        machina::ResponseFields fields;
        std::string why;
        if (!machina::decode_response(std::string_view(line), fields, why)) {
          throw py::value_error("unreadable response: " + why);
        }
        return results().make(aid, fields);
      },
      "line"_a, "aid"_a, "Decodes one response line into a ToolResult.");
  m.def(
      "delta_between",
      [](const std::string& before, const std::string& after) {
        std::string out, why;
        if (!machina::delta_between(before, after, out, why)) throw py::value_error("not a ds_state: " + why);
        return out;
      },
      "before"_a, "after"_a, "The delta from one full state to another, as --serve answers it (\"\" if none).");
  m.def(
      "_configure_results",
      [](py::type cls, py::dict kinds) { results().configure(std::move(cls), kinds); }, "cls"_a, "kinds"_a,
      "Registers the result class (a tuple subclass of 10 fields) and the error kind each wire code maps to.");

  py::class_<machina::Session>(m, "Session", "One caller's ds_state; delta=True answers with deltas (serve).")
      .def(py::init<bool>(), "delta"_a = true)
      .def_property_readonly("delta", &machina::Session::respond_with_delta)
      .def("state_json",
           [](const machina::Session& s) {
             std::string out;
             machina::encode_ds_state({machina::DsReport::Mode::full, s.as_changes()}, out);
             return out;
           },
           "The full state as JSON text ({\"slots\": {...}}).");

  py::class_<machina::Host>(m, "Host", "The host: load plugins, then call tools. Thread-safe.")
      .def(py::init([](const py::kwargs& options) { return std::make_unique<machina::Host>(make_options(options)); }),
           "Host(**options): the options of machina_dispatch.host_options(), each defaulting to the core's own.")
      .def("load_plugin", &machina::Host::load_plugin, "path"_a,
           "Loads a plugin library; returns the aids it added. Raises HostError naming the file.")
      .def("load_tools", &machina::Host::load_tools, "path"_a, py::call_guard<py::gil_scoped_release>(),
           "Loads the tools a TOML tool manifest declares; returns the aids it added. Raises HostError naming "
           "file, line and field.")
      .def(
          "add_packs",
          [](machina::Host& host, const std::vector<std::string>& packs, const std::optional<std::string>& policy) {
            machina::Policy p = policy ? machina::load_policy(*policy, [] {
              const char* ws = std::getenv("MACHINA_TOOLHOST_WORKSPACE");
              return std::string(ws != nullptr ? ws : "");
            }())
                                       : machina::policy_from_env();
            return host.add_packs(packs, std::move(p));
          },
          "packs"_a = std::vector<std::string>{}, "policy"_a = py::none(),
          "Registers the built-in tool packs (names: files, shell; empty: all) under every name, with the policy "
          "file `policy` (None: $MACHINA_TOOLHOST_POLICY, else the safe defaults); returns the names added. Raises "
          "HostError for an unknown pack, a bad policy file or a name already registered.")
      .def("list_tools",
           [](const machina::Host& h) { return py::module_::import("json").attr("loads")(machina::tool_list_json(h)); },
           "The registered tools, as --list shows them (see tool_list.hpp).")
      .def(
          "resolve_tool",
          [](const machina::Host& h, std::string_view name) -> std::optional<std::string> {
            const machina::Tool* tool = h.registry().resolve(name);
            return tool != nullptr ? std::optional<std::string>(tool->info.aid) : std::nullopt;
          },
          "name"_a, "The aid of the tool a name stands for in every front (an aid, an LLM function name or a "
          "display name no other tool has), or None.")
      .def(
          "call_json",
          [](machina::Host& h, const std::string& request, machina::Session& session, const std::string& aid,
             const std::string& front) {
            std::string out;
            machina::ndjson::respond(h, request, session, out, nullptr, aid, /*nul_terminated=*/true,
                                     front_named(front));
            out.pop_back();  // the trailing newline belongs to the NDJSON framing
            return out;
          },
          "request"_a, "session"_a, "aid"_a = "", "front"_a = "python", py::call_guard<py::gil_scoped_release>(),
          "Handles one JSON request exactly as --serve would (with `aid`: as --run would); returns the response JSON. "
          "`front` names the front the audit store records (python, nats, http, ...).")
      .def(
          "stats",
          [](const machina::Host& h) {
            const auto s = h.stats();
            return py::dict("calls"_a = s.calls, "timeouts"_a = s.timeouts, "crashes"_a = s.crashes,
                            "stuck_now"_a = s.stuck_now, "stuck_peak"_a = s.stuck_peak,
                            "workers_started"_a = s.workers.started, "workers_crashed"_a = s.workers.crashed,
                            "workers_timed_out"_a = s.workers.timed_out, "workers_live"_a = s.workers.live,
                            "workers_lost_idle"_a = s.workers.lost_idle, "worker_calls"_a = s.workers.calls);
          },
          "The host's counters (calls, timeouts, crashes, stuck inline calls, isolated workers).")
      .def("close", &machina::Host::close, py::call_guard<py::gil_scoped_release>(),
           "Ends the isolated worker processes, Python workers, skills and MCP servers now (calls running in them "
           "fail).")
      .def("session_started", &machina::Host::session_started, "id"_a, py::call_guard<py::gil_scoped_release>(),
           "A session began: the hosted skills are told (lifecycle/onSessionStart).")
      .def("session_ended", &machina::Host::session_ended, "id"_a, py::call_guard<py::gil_scoped_release>(),
           "A session ended: the hosted skills are told (lifecycle/onSessionEnd).")
      .def_property_readonly("idempotency_entries", &machina::Host::idempotency_entries);

  m.def(
      "issue_lease",
      [](const std::string& aid, double ttl_s, std::optional<std::string> secret) {
        machina::LeaseAuthority authority(secret ? *secret : machina::load_lease_secret(), {});
        return authority.issue(aid, machina::lease_ttl_ms(ttl_s, authority.options().max_ttl_ms),
                               machina::unix_now_ms());
      },
      "aid"_a, "ttl_s"_a = 60.0, "secret"_a = py::none(),
      "Mints a single-use lease token for `aid` (operator side). The secret defaults to "
      "MACHINA_LEASE_SECRET / MACHINA_LEASE_KEY_FILE.");
}
