// Host and Session (a caller's state, machina::CallerState): the host built from keyword
// options (host_options_binding.hpp), its loaders, and the JSON call of the other fronts.
#include "host_options_binding.hpp"
#include "module_parts.hpp"

#include <machina/audit.hpp>
#include <machina/ds_state_codec.hpp>
#include <machina/ndjson_front.hpp>
#include <machina/policy.hpp>
#include <machina/tool_host.hpp>
#include <machina/tool_list.hpp>

#include <pybind11/stl.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace machina::binding {

using namespace py::literals;

namespace {

/// A front's name as given from Python, checked: what the audit store records.
std::string_view front_name(const std::string& name) {
  const bool word = std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
  });
  if (name.empty() || name.size() > machina::kAuditMaxFront || !word) {
    throw machina::ConfigError("front '" + name + "': a name of 1 to " + std::to_string(machina::kAuditMaxFront) +
                               " letters, digits, '-' or '_'");
  }
  return name;
}

}  // namespace

void bind_host(py::module_& m) {
  bind_host_options(m);
  m.def(
      "loads_plugin_libraries",
      [](const std::optional<std::vector<std::string>>& plugins) {
        machina::ToolChoice choice;
        choice.plugins = plugins;
        return machina::loads_plugin_libraries(choice);
      },
      "plugins"_a, "Whether these plugins (None: the built-in tools) need a build that loads plugin libraries.");

  py::class_<machina::CallerState>(m, "Session", "One caller's ds_state; delta=True answers with deltas (serve).")
      .def(py::init<bool>(), "delta"_a = true)
      .def_property_readonly("delta", &machina::CallerState::respond_with_delta)
      .def(
          "state_json",
          [](const machina::CallerState& s) {
            std::string out;
            machina::encode_ds_state({machina::DsReport::Mode::full, s.as_changes()}, out);
            return out;
          },
          "The full state as JSON text ({\"slots\": {...}}).");

  py::class_<machina::ToolHost>(m, "Host", "The host: load plugins, then call tools. Thread-safe.")
      .def(py::init([](const py::kwargs& options) {
             return std::make_unique<machina::ToolHost>(host_options_from_kwargs(options));
           }),
           "Host(**options): the options of _core.host_options(), each defaulting to the core's own.")
      .def("load_plugin", &machina::ToolHost::load_plugin, "path"_a,
           "Loads a plugin library; returns the aids it added. Raises HostError naming the file.")
      .def("load_tools", &machina::ToolHost::load_tools, "path"_a, py::call_guard<py::gil_scoped_release>(),
           "Loads the tools a TOML tool manifest declares; returns the aids it added. Raises HostError naming "
           "file, line and field.")
      .def(
          "add_packs",
          [](machina::ToolHost& host, const std::vector<std::string>& packs, const std::optional<std::string>& policy) {
            return host.add_packs(packs, machina::pack_policy(policy.value_or("")));
          },
          "packs"_a = std::vector<std::string>{}, "policy"_a = py::none(),
          "Registers the built-in tool packs (names: files, shell; empty: all) under every name, with the policy "
          "file `policy` (None: $MACHINA_TOOLHOST_POLICY, else the safe defaults); returns the names added. Raises "
          "HostError for an unknown pack, a bad policy file or a name already registered.")
      .def(
          "load_default_tools",
          [](machina::ToolHost& host, std::optional<std::vector<std::string>> plugins,
             std::optional<std::vector<std::string>> packs, const std::optional<std::string>& policy,
             std::vector<std::string> tools, std::string builtin_plugin) {
            machina::ToolChoice choice;
            choice.plugins = std::move(plugins);
            choice.packs = std::move(packs);
            choice.policy_file = policy.value_or("");
            choice.manifests = std::move(tools);
            choice.builtin_plugin = std::move(builtin_plugin);
            choice.load_library = &machina::ToolHost::load_plugin;
            return host.load_default_tools(choice);
          },
          "plugins"_a = py::none(), "packs"_a = py::none(), "policy"_a = py::none(),
          "tools"_a = std::vector<std::string>{}, "builtin_plugin"_a,
          "Loads the tools asked for, as every front does: the plugin libraries (None: the built-in plugin at "
          "`builtin_plugin`), the tool packs (None: every pack when no plugin is named, else none) under the policy "
          "file `policy` (None: $MACHINA_TOOLHOST_POLICY, else the safe defaults), then the tool manifests `tools`. "
          "Returns the names added. Raises HostError as load_plugin, add_packs and load_tools do.")
      .def(
          "list_tools",
          [](const machina::ToolHost& h) {
            return py::module_::import("json").attr("loads")(machina::tool_list_json(h.host()));
          },
          "The registered tools, as --list shows them (see tool_list.hpp).")
      .def(
          "resolve_tool",
          [](const machina::ToolHost& h, std::string_view name) -> std::optional<std::string> {
            const machina::Tool* tool = h.registry().resolve(name);
            return tool != nullptr ? std::optional<std::string>(tool->info.aid) : std::nullopt;
          },
          "name"_a,
          "The aid of the tool a name stands for in every front (an aid, an LLM function name or a "
          "display name no other tool has), or None.")
      .def(
          "call_json",
          [](machina::ToolHost& h, const std::string& request, machina::CallerState& session, const std::string& aid,
             const std::string& front, bool local_caller) {
            std::string out;
            machina::ndjson::respond(h.host(), request, session, out, {front_name(front), local_caller}, nullptr, aid,
                                     /*nul_terminated=*/true);
            out.pop_back();  // the trailing newline belongs to the NDJSON framing
            return out;
          },
          "request"_a, "session"_a, "aid"_a = "", "front"_a = "python", "local_caller"_a = true,
          py::call_guard<py::gil_scoped_release>(),
          "Handles one JSON request exactly as --serve would (with `aid`: as --run would); returns the response JSON. "
          "`front` names the front the audit store records (1 to 32 letters, digits, '-' or '_'); "
          "`local_caller`: the caller is this process's OS user (the store then names that user when the "
          "request names none).")
      .def(
          "stats",
          [](const machina::ToolHost& h) {
            const auto s = h.stats();
            return py::dict("calls"_a = s.calls, "timeouts"_a = s.timeouts, "crashes"_a = s.crashes,
                            "stuck_now"_a = s.stuck_now, "stuck_peak"_a = s.stuck_peak,
                            "workers_started"_a = s.workers.started, "workers_crashed"_a = s.workers.crashed,
                            "workers_timed_out"_a = s.workers.timed_out, "workers_live"_a = s.workers.live,
                            "workers_lost_idle"_a = s.workers.lost_idle, "worker_calls"_a = s.workers.calls);
          },
          "The host's counters (calls, timeouts, crashes, stuck inline calls, isolated workers).")
      .def("close", &machina::ToolHost::close, py::call_guard<py::gil_scoped_release>(),
           "Ends the isolated worker processes, Python workers, skills and MCP servers now (calls running in them "
           "fail).")
      .def("session_started", &machina::ToolHost::connection_opened, "id"_a, py::call_guard<py::gil_scoped_release>(),
           "A session began: the hosted skills are told (lifecycle/onSessionStart).")
      .def("session_ended", &machina::ToolHost::connection_closed, "id"_a, py::call_guard<py::gil_scoped_release>(),
           "A session ended: the hosted skills are told (lifecycle/onSessionEnd).")
      .def_property_readonly("idempotency_entries",
                             [](const machina::ToolHost& h) { return h.host().idempotency_entries(); });
}

}  // namespace machina::binding
