// Conversions between Python objects and the core's types, shared by the parts of _core:
// str to std::string, the C++ object behind a bound instance, a C++ exception to a Python
// error.
#pragma once

#include <pybind11/pybind11.h>

#include <array>
#include <cstddef>
#include <exception>
#include <optional>
#include <string>

namespace machina::binding {

namespace py = pybind11;

/// The C++ object behind a bound instance. pybind11's cast checks the type through its
/// registry on every call; here the Python types already seen to hold a T are remembered
/// (the registry still decides the first time for each type).
template <class T>
T& bound(PyObject* o) {
  static std::array<PyTypeObject*, 8> known{};
  PyTypeObject* type = Py_TYPE(o);
  for (PyTypeObject* t : known) {
    if (t == type)
      return *static_cast<T*>(reinterpret_cast<py::detail::instance*>(o)->get_value_and_holder().value_ptr());
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

/// The text of a str; TypeError naming `what` for anything else.
inline std::string utf8(PyObject* o, const char* what) {
  Py_ssize_t n = 0;
  const char* p = PyUnicode_AsUTF8AndSize(o, &n);
  if (p == nullptr) throw py::type_error(std::string(what) + " must be a str");
  return std::string(p, static_cast<std::size_t>(n));
}

/// The text of a str, or nothing for None; TypeError naming `what` for anything else.
inline std::optional<std::string> optional_str(PyObject* o, const char* what) {
  if (o == Py_None) return std::nullopt;
  Py_ssize_t n = 0;
  const char* p = PyUnicode_AsUTF8AndSize(o, &n);
  if (p == nullptr) throw py::type_error(std::string(what) + " must be a str or None");
  return std::string(p, static_cast<std::size_t>(n));
}

/// The Python error for the exception being handled (call from a catch block); returns
/// nullptr, the value a raw C function gives back with an error set.
inline PyObject* python_error() noexcept {
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

}  // namespace machina::binding
