// ResultFactory: the ToolResult tuple filled field by field from a response.
#include "result_factory.hpp"

#include <machina/ds_state_codec.hpp>

#include <stdexcept>

namespace machina::binding {

using namespace py::literals;

namespace {

constexpr std::string_view kEmptyDelta = R"({"delta":true,"slots":{},"removed_slots":[]})";

void set(PyObject* tuple, ResultField field, const py::object& value) {
  PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(field), value.inc_ref().ptr());
}

// A result holds strings, bools and None, plus the `details` dict on some failures:
// without that dict it can never be part of a reference cycle (the class has no
// __dict__), so the cycle collector need not track it. Results are made by the
// hundred thousand in a batch, and every tracked one is scanned again by each
// collection the batch's allocations set off.
void untrack_if_acyclic(PyObject* obj) {
  if (PyTuple_GET_ITEM(obj, static_cast<Py_ssize_t>(ResultField::details)) == Py_None && PyObject_GC_IsTracked(obj))
    PyObject_GC_UnTrack(obj);
}

}  // namespace

ResultFactory& results() {
  static ResultFactory* factory = new ResultFactory();  // never destroyed: outlives the interpreter's teardown
  return *factory;
}

py::tuple ResultFactory::field_names() {
  static const char* const names[] = {
#define MACHINA_NAME_ENTRY(name) #name,
      MACHINA_RESULT_FIELDS(MACHINA_NAME_ENTRY)
#undef MACHINA_NAME_ENTRY
  };
  py::tuple out(kFields);
  for (std::size_t i = 0; i < kFields; ++i) out[i] = py::str(names[i]);
  return out;
}

void ResultFactory::configure(py::type cls, const py::dict& kinds) {
  if (!PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(cls.ptr()), &PyTuple_Type)) {
    throw py::type_error("the result class must be a tuple subclass");
  }
  const py::tuple expected = field_names();
  const py::object fields = py::getattr(cls, "_fields", py::none());
  if (!fields.equal(expected)) {
    throw py::type_error("the result class's fields " + py::repr(fields).cast<std::string>() +
                         " differ from the ones the core fills " + py::repr(expected).cast<std::string>());
  }
  cls_ = std::move(cls);
  for (const auto& info : machina::all_error_kinds()) {
    const std::string code(info.code);
    codes_[index(info.kind)] = py::str(code);
    kinds_[index(info.kind)] =
        kinds.contains(code) ? py::reinterpret_borrow<py::object>(kinds[code.c_str()]) : py::object(py::str(code));
    statuses_[index(info.kind)] = py::str(std::string(machina::status_name(info.status)));
  }
  statuses_[0] = py::str("OK");
  empty_ = py::str("");
  for (const auto& info : machina::all_error_kinds()) by_code_.emplace(std::string(info.code), index(info.kind));
}

py::object ResultFactory::make(const py::object& aid, const machina::ResponseFields& f) const {
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
  set(obj, ResultField::aid, aid);
  set(obj, ResultField::ok, py::bool_(f.ok));
  set(obj, ResultField::status,
      f.status ? (k == 0 ? py::object(py::str(*f.status)) : statuses_[k]) : py::object(py::none()));
  set(obj, ResultField::output_json, f.output_json.empty() ? empty_ : py::object(py::str(f.output_json)));
  set(obj, ResultField::error, f.error.empty() ? empty_ : py::object(py::str(f.error)));
  set(obj, ResultField::code, f.ok ? py::object(py::none()) : codes_[k]);
  set(obj, ResultField::kind, f.ok ? py::object(py::none()) : kinds_[k]);
  set(obj, ResultField::idempotent_hit, py::bool_(f.idempotent_hit));
  if (f.ds_state.empty())
    set(obj, ResultField::ds_state_json, py::none());
  else if (f.ds_state == kEmptyDelta)
    set(obj, ResultField::ds_state_json, empty_);
  else
    set(obj, ResultField::ds_state_json, py::str(std::string(f.ds_state)));
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
  set(obj, ResultField::details, details);
  set(obj, ResultField::trace_json,
      f.trace.empty() ? py::object(py::none()) : py::object(py::str(std::string(f.trace))));
  untrack_if_acyclic(obj);
  return result;
}

py::object ResultFactory::make(const py::object& aid, const machina::Response& r) const {
  PyObject* obj = alloc();
  py::object result = py::reinterpret_steal<py::object>(obj);
  const std::size_t k = index(r.kind);
  const bool call_response = machina::error_info(r.kind).call_response;
  set(obj, ResultField::aid, aid);
  set(obj, ResultField::ok, py::bool_(r.ok()));
  set(obj, ResultField::status, statuses_[k]);
  set(obj, ResultField::output_json, r.output_json.empty() ? empty_ : py::object(py::str(r.output_json)));
  set(obj, ResultField::error, r.error.empty() ? empty_ : py::object(py::str(r.error)));
  set(obj, ResultField::code, r.ok() ? py::object(py::none()) : codes_[k]);
  set(obj, ResultField::kind, r.ok() ? py::object(py::none()) : kinds_[k]);
  set(obj, ResultField::idempotent_hit, py::bool_(r.idempotent_hit));
  if (!call_response) {
    set(obj, ResultField::ds_state_json, py::none());
  } else if (r.ds_state.mode == machina::DsReport::Mode::delta &&
             (!r.ds_state.changes || r.ds_state.changes->empty())) {
    set(obj, ResultField::ds_state_json, empty_);  // the common case: no change
  } else {
    std::string ds;
    machina::encode_ds_state(r.ds_state, ds);
    set(obj, ResultField::ds_state_json, py::str(ds));
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
  set(obj, ResultField::details, details);
  set(obj, ResultField::trace_json, r.trace_json.empty() ? py::object(py::none()) : py::object(py::str(r.trace_json)));
  untrack_if_acyclic(obj);
  return result;
}

PyObject* ResultFactory::alloc() const {
  if (!cls_) throw std::runtime_error("machina_dispatch._core: result class not configured");
  auto* type = reinterpret_cast<PyTypeObject*>(cls_.ptr());
  PyObject* obj = type->tp_alloc(type, static_cast<Py_ssize_t>(kFields));
  if (obj == nullptr) throw py::error_already_set();
  return obj;
}

}  // namespace machina::binding
