// machina_dispatch._core: the C++ host in-process. Only converts types; every rule
// lives in the core, where the CLI uses it too. Each part of the module is in a file of
// its own (module_parts.hpp); this one registers them.
#include "module_parts.hpp"
#include "result_factory.hpp"

#include <machina/errors.hpp>
#include <machina/http_client.hpp>
#include <machina/lease.hpp>
#include <machina/tool_host.hpp>
#include <machina/tool_names.hpp>

#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace py = pybind11;
using namespace py::literals;

PYBIND11_MODULE(_core, m) {
  machina::http::use_system_resolver();  // (names of HTTP tool services)
  machina::http::use_tls();              // (https tool services)
  machina::binding::bind_fast_calls(m);
  m.doc() = "The machina-toolhost C++ host, in-process.";
  m.attr("__version__") = MACHINA_VERSION;
  m.attr("MAX_REQUEST_BYTES") = machina::kMaxRequestBytes;
  m.attr("MAX_OUTPUT_BYTES") = machina::kMaxOutputBytes;
  m.attr("BUILTIN_PLUGIN_FILE") = std::string(machina::kBuiltinPluginFile);

  // machina::ConfigError becomes machina_dispatch.HostError (a ToolhostError), once the
  // package has named it (_configure_errors); a RuntimeError before that.
  static PyObject* host_error = PyExc_RuntimeError;
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const machina::ConfigError& e) {
      PyErr_SetString(host_error, e.what());
    }
  });
  m.def(
      "_configure_errors",
      [](py::type cls) {
        if (!PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(cls.ptr()),
                              reinterpret_cast<PyTypeObject*>(PyExc_Exception)))
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
      "schema_json"_a,
      "The input schema, as JSON text, a tool declaring this one is advertised with (tool_names.hpp).");
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
  using machina::binding::ResultFactory;
  static const std::string configure_results_doc =
      "Registers the result class (a tuple subclass whose _fields are those of RESULT_FIELDS, " +
      std::to_string(ResultFactory::kFields) +
      " of them) and the error kind each wire code maps to. Raises TypeError for another class shape.";
  m.attr("RESULT_FIELDS") = ResultFactory::field_names();
  m.def(
      "_configure_results",
      [](py::type cls, py::dict kinds) { machina::binding::results().configure(std::move(cls), kinds); }, "cls"_a,
      "kinds"_a, configure_results_doc.c_str());

  machina::binding::bind_processes(m);
  machina::binding::bind_pool(m);
  machina::binding::bind_host(m);

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
