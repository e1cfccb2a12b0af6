// machina_dispatch._core: the C++ host in-process. Only converts types; every rule
// lives in the core, where the CLI uses it too.
#include <machina/host.hpp>
#include <machina/json_text.hpp>
#include <machina/lease.hpp>
#include <machina/wire.hpp>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

namespace py = pybind11;
using namespace py::literals;

namespace {

machina::HostOptions make_options(std::size_t max_request_bytes, std::size_t max_output_bytes,
                                  std::int64_t idempotency_ttl_ms, std::size_t idempotency_max_entries,
                                  std::uint32_t breaker_threshold, std::int64_t breaker_window_ms,
                                  std::int64_t breaker_cooldown_ms) {
  machina::HostOptions o = machina::HostOptions::from_env();
  o.max_request_bytes = max_request_bytes;
  o.max_output_bytes = max_output_bytes;
  o.idempotency.ttl_ms = idempotency_ttl_ms;
  o.idempotency.max_entries = idempotency_max_entries;
  o.breaker.threshold = breaker_threshold;
  o.breaker.window_ms = breaker_window_ms;
  o.breaker.cooldown_ms = breaker_cooldown_ms;
  return o;
}

py::dict tool_dict(const machina::ToolInfo& t) {
  return py::dict("aid"_a = t.aid, "name"_a = t.name, "description"_a = t.description,
                  "input_schema"_a = t.input_schema.empty() ? py::object(py::none()) : py::object(py::str(t.input_schema)),
                  "deterministic"_a = t.deterministic, "tags"_a = t.tags, "side_effects"_a = t.side_effects,
                  "replay_inputs"_a = t.replay_inputs, "tier"_a = t.tier, "plugin"_a = t.plugin_path);
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "The machina-toolhost C++ host, in-process.";
  m.attr("__version__") = MACHINA_VERSION;
  m.attr("MAX_REQUEST_BYTES") = machina::kMaxRequestBytes;
  m.attr("MAX_OUTPUT_BYTES") = machina::kMaxOutputBytes;
  m.attr("BUILTIN_PLUGIN_FILE") = std::string(machina::kBuiltinPluginFile);

  static py::exception<machina::HostError> host_error(m, "HostError", PyExc_RuntimeError);
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const machina::HostError& e) {
      py::set_error(host_error, e.what());
    }
  });

  m.def(
      "error_kinds",
      [] {
        py::list out;
        for (const auto& k : machina::all_error_kinds()) {
          out.append(py::make_tuple(std::string(k.code), std::string(machina::status_name(k.status)),
                                    k.counts_for_breaker));
        }
        return out;
      },
      "Every error kind as (code, status or '', counts_for_breaker), in the core's order.");

  // Test hooks: the same check through the fast path or the reference parser alone.
  m.def(
      "_check_json",
      [](const std::string& text, bool reference) -> std::optional<std::string> {
        std::string why;
        const bool ok = reference ? machina::detail::validate_json_reference(text, &why)
                                  : machina::validate_json(text, &why);
        return ok ? std::nullopt : std::optional<std::string>(why);
      },
      "text"_a, "reference"_a = false);
  m.def(
      "_decode_request",
      [](const std::string& text, bool reference) -> py::tuple {
        machina::Request req;
        machina::Response err;
        const bool ok = reference ? machina::detail::decode_request_reference(text, req, err)
                                  : machina::decode_request(text, req, err, /*nul_terminated=*/true);
        if (!ok) return py::make_tuple(false, err.error, std::string(machina::error_info(err.kind).code), err.id_json);
        std::string ds;
        if (req.ds_state) {
          ds = req.ds_state->delta ? "delta:" : "full:";
          auto changes = std::make_shared<machina::SlotChanges>(req.ds_state->changes);
          machina::encode_ds_state({machina::DsReport::Mode::delta, changes}, ds);
        }
        return py::make_tuple(true, req.aid, req.input_json, req.id_json, req.idempotency_key, req.lease_token, ds);
      },
      "text"_a, "reference"_a = false);

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
      .def(py::init([](std::size_t max_request_bytes, std::size_t max_output_bytes, std::int64_t idempotency_ttl_ms,
                       std::size_t idempotency_max_entries, std::uint32_t breaker_threshold,
                       std::int64_t breaker_window_ms, std::int64_t breaker_cooldown_ms) {
             return std::make_unique<machina::Host>(make_options(max_request_bytes, max_output_bytes, idempotency_ttl_ms,
                                                                 idempotency_max_entries, breaker_threshold,
                                                                 breaker_window_ms, breaker_cooldown_ms));
           }),
           py::kw_only(), "max_request_bytes"_a = machina::kMaxRequestBytes,
           "max_output_bytes"_a = machina::kMaxOutputBytes, "idempotency_ttl_ms"_a = std::int64_t{60'000},
           "idempotency_max_entries"_a = std::size_t{1024}, "breaker_threshold"_a = std::uint32_t{5},
           "breaker_window_ms"_a = std::int64_t{30'000}, "breaker_cooldown_ms"_a = std::int64_t{10'000})
      .def("load_plugin", &machina::Host::load_plugin, "path"_a,
           "Loads a plugin library; returns the aids it added. Raises HostError naming the file.")
      .def("list_tools",
           [](const machina::Host& h) {
             py::list out;
             for (const auto& t : h.registry().list()) out.append(tool_dict(t));
             return out;
           })
      .def(
          "call_json",
          [](machina::Host& h, const std::string& request, machina::Session& session, const std::string& aid) {
            std::string out;
            h.handle_json(request, session, out, aid, /*nul_terminated=*/true);
            out.pop_back();  // the trailing newline belongs to the NDJSON framing
            return out;
          },
          "request"_a, "session"_a, "aid"_a = "", py::call_guard<py::gil_scoped_release>(),
          "Handles one JSON request exactly as --serve would (with `aid`: as --run would); returns the response JSON.")
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
