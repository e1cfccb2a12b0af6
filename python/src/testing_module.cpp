// machina_dispatch._testing: hooks for the test suite and the benchmarks, kept out of the
// production module (_core). Each reaches a part of the core that no public call isolates.
#include <machina/errors.hpp>
#include <machina/json_text.hpp>
#include <machina/ndjson_wire.hpp>
#include <machina/tool_host.hpp>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

namespace py = pybind11;
using namespace py::literals;

PYBIND11_MODULE(_testing, m) {
  m.doc() = "Test and benchmark hooks into the machina-toolhost core (not an API).";
  m.def(
      "check_json",
      [](const std::string& text, bool reference) -> std::optional<std::string> {
        // The same check through the fast path or the reference parser alone.
        std::string why;
        const bool ok =
            reference ? machina::detail::validate_json_reference(text, &why) : machina::validate_json(text, &why);
        return ok ? std::nullopt : std::optional<std::string>(why);
      },
      "text"_a, "reference"_a = false);
  m.def(
      "decode_request",
      [](const std::string& text, bool reference) -> py::tuple {
        // A request decoded through the fast path or the reference parser alone.
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
  m.def(
      "time_handle",
      [](const std::string& plugin, const std::string& aid, const std::string& input_json, int n) {
        // Seconds per call of the core alone (no Python, a host of its own with `plugin`
        // loaded), for the in-process overhead figure.
        machina::ToolHost tools{machina::HostOptions{}};
        tools.load_plugin(plugin);
        machina::Host& host = tools.host();
        machina::CallerState session(/*respond_with_delta=*/true);
        machina::Request req;
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < n; ++i) {
          req.aid = aid;
          req.input_json = input_json;
          machina::Response r = host.handle(req, session);
        }
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / n;
      },
      "plugin"_a, "aid"_a, "input_json"_a, "n"_a, py::call_guard<py::gil_scoped_release>());
}
