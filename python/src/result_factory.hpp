// ToolResult objects made straight from the core's responses, without a Python call.
#pragma once

#include <machina/errors.hpp>
#include <machina/ndjson_client.hpp>
#include <machina/request.hpp>

#include <pybind11/pybind11.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>

namespace machina::binding {

namespace py = pybind11;

/// The fields of machina_dispatch._result.ToolResult, in its order.
#define MACHINA_RESULT_FIELDS(X) \
  X(aid)                         \
  X(ok)                          \
  X(status)                      \
  X(output_json)                 \
  X(error)                       \
  X(code)                        \
  X(kind)                        \
  X(idempotent_hit)              \
  X(ds_state_json)               \
  X(details)                     \
  X(trace_json)

enum class ResultField : std::uint8_t {
#define MACHINA_ENUM_ENTRY(name) name,
  MACHINA_RESULT_FIELDS(MACHINA_ENUM_ENTRY)
#undef MACHINA_ENUM_ENTRY
      count
};

/// Builds result objects of the Python result class (a tuple subclass registered by
/// machina_dispatch) straight from a core Response. Strings that repeat (statuses,
/// codes, kinds) are made once.
class ResultFactory {
 public:
  static constexpr std::size_t kFields = static_cast<std::size_t>(ResultField::count);

  /// The field names, in order (what the result class's `_fields` must be).
  static py::tuple field_names();

  /// Registers the result class and the error kind each wire code maps to. Throws
  /// TypeError when the class is not a tuple subclass with exactly these fields.
  void configure(py::type cls, const py::dict& kinds);

  /// From a response read off the wire: the same object the in-process call makes.
  /// Throws ValueError (py::value_error) for a code this build does not know.
  py::object make(const py::object& aid, const machina::ResponseFields& f) const;
  /// From the host's own response (the in-process call).
  py::object make(const py::object& aid, const machina::Response& r) const;

 private:
  PyObject* alloc() const;

  static std::size_t index(machina::ErrorKind kind) { return static_cast<std::size_t>(kind); }

  static constexpr std::size_t kKinds =
      std::tuple_size_v<std::remove_cvref_t<decltype(machina::all_error_kinds())>> + 1;
  py::object cls_;
  std::array<py::object, kKinds> codes_, kinds_, statuses_;
  py::object empty_;
  std::unordered_map<std::string, std::size_t> by_code_;
};

/// The module's one factory (never destroyed: it outlives the interpreter's teardown).
ResultFactory& results();

}  // namespace machina::binding
