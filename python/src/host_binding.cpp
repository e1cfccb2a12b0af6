// Host and Session: the host built from keyword options, its loaders, and the JSON
// call of the other fronts.
#include "module_parts.hpp"

#include <machina/ndjson_front.hpp>
#include <machina/policy.hpp>
#include <machina/tool_host.hpp>
#include <machina/tool_list.hpp>
#include <machina/wire.hpp>

#include <pybind11/stl.h>

#include <algorithm>
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
      {"max_request_bytes",
       [](O& o, py::handle v) { o.max_request_bytes = as<std::size_t>(v, "max_request_bytes", "an int"); }},
      {"max_output_bytes",
       [](O& o, py::handle v) { o.max_output_bytes = as<std::size_t>(v, "max_output_bytes", "an int"); }},
      {"idempotency_ttl_ms",
       [](O& o, py::handle v) { o.idempotency.ttl_ms = as<std::int64_t>(v, "idempotency_ttl_ms", "an int"); }},
      {"idempotency_max_entries",
       [](O& o, py::handle v) { o.idempotency.max_entries = as<std::size_t>(v, "idempotency_max_entries", "an int"); }},
      {"idempotency_max_key_bytes",
       [](O& o, py::handle v) {
         o.idempotency.max_key_bytes = as<std::size_t>(v, "idempotency_max_key_bytes", "an int");
       }},
      {"idempotency_max_bytes",
       [](O& o, py::handle v) {
         o.idempotency.max_stored_bytes = as<std::size_t>(v, "idempotency_max_bytes", "an int");
       }},
      {"breaker_threshold",
       [](O& o, py::handle v) { o.breaker.threshold = as<std::uint32_t>(v, "breaker_threshold", "an int"); }},
      {"breaker_window_ms",
       [](O& o, py::handle v) { o.breaker.window_ms = as<std::int64_t>(v, "breaker_window_ms", "an int"); }},
      {"breaker_cooldown_ms",
       [](O& o, py::handle v) { o.breaker.cooldown_ms = as<std::int64_t>(v, "breaker_cooldown_ms", "an int"); }},
      {"timeout_ms", [](O& o, py::handle v) { o.default_timeout_ms = as<std::int64_t>(v, "timeout_ms", "an int"); }},
      {"max_timeout_ms",
       [](O& o, py::handle v) { o.max_timeout_ms = as<std::int64_t>(v, "max_timeout_ms", "an int"); }},
      {"tool_timeouts_ms",
       [](O& o, py::handle v) {
         for (const auto& [aid, ms] :
              as<std::map<std::string, std::int64_t>>(v, "tool_timeouts_ms", "a dict of aid to int")) {
           o.tool_timeouts_ms[aid] = ms;
         }
       }},
      {"max_stuck_calls",
       [](O& o, py::handle v) { o.max_stuck_calls = as<std::size_t>(v, "max_stuck_calls", "an int"); }},
      {"isolation",
       [](O& o, py::handle v) {
         const auto mode = as<std::string>(v, "isolation", "a str");
         if (mode == "process")
           o.isolation = machina::Isolation::process;
         else if (mode == "inline")
           o.isolation = machina::Isolation::inline_threads;
         else
           throw machina::HostError("isolation must be 'inline' or 'process', not '" + mode + "'");
       }},
      {"worker_executable",
       [](O& o, py::handle v) { o.workers.executable = as<std::string>(v, "worker_executable", "a str"); }},
      {"isolation_workers",
       [](O& o, py::handle v) { o.workers.size = as<std::size_t>(v, "isolation_workers", "an int"); }},
      {"limit_cpu_s",
       [](O& o, py::handle v) { o.workers.limits.cpu_seconds = as<std::uint64_t>(v, "limit_cpu_s", "an int"); }},
      {"limit_memory_mb",
       [](O& o, py::handle v) {
         o.workers.limits.address_space_mb = as<std::uint64_t>(v, "limit_memory_mb", "an int");
       }},
      {"limit_open_files",
       [](O& o, py::handle v) { o.workers.limits.open_files = as<std::uint64_t>(v, "limit_open_files", "an int"); }},
      {"limit_file_size_mb",
       [](O& o, py::handle v) {
         o.workers.limits.file_size_mb = as<std::uint64_t>(v, "limit_file_size_mb", "an int");
       }},
      {"no_network", [](O& o, py::handle v) { o.workers.limits.no_network = as<bool>(v, "no_network", "a bool"); }},
      {"worker_env",
       [](O& o, py::handle v) { o.workers.pass_env = as<std::vector<std::string>>(v, "worker_env", "a list of str"); }},
      {"python_workers", [](O& o, py::handle v) { o.python_workers = as<std::size_t>(v, "python_workers", "an int"); }},
      {"python_memory_mb",
       [](O& o, py::handle v) { o.python_memory_mb = as<std::uint64_t>(v, "python_memory_mb", "an int"); }},
      {"skill_tick_ms", [](O& o, py::handle v) { o.skill_tick_ms = as<std::int64_t>(v, "skill_tick_ms", "an int"); }},
      {"audit_db", [](O& o, py::handle v) { o.audit.db_path = as<std::string>(v, "audit_db", "a str"); }},
      {"audit_jsonl", [](O& o, py::handle v) { o.audit.jsonl_path = as<std::string>(v, "audit_jsonl", "a str"); }},
      {"audit_retention_days",
       [](O& o, py::handle v) { o.audit.retention_days = as<std::int64_t>(v, "audit_retention_days", "an int"); }},
      {"audit_max_rows",
       [](O& o, py::handle v) { o.audit.max_rows = as<std::int64_t>(v, "audit_max_rows", "an int"); }},
      {"audit_required",
       [](O& o, py::handle v) {
         o.audit.required = machina::parse_audit_required(as<std::string>(v, "audit_required", "a str"));
       }},
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

}  // namespace

void bind_host(py::module_& m) {
  m.def(
      "host_options",
      [] {
        py::list names;
        for (const auto& entry : host_options()) names.append(entry.first);
        return names;
      },
      "The keyword options Host() takes.");

  py::class_<machina::Session>(m, "Session", "One caller's ds_state; delta=True answers with deltas (serve).")
      .def(py::init<bool>(), "delta"_a = true)
      .def_property_readonly("delta", &machina::Session::respond_with_delta)
      .def(
          "state_json",
          [](const machina::Session& s) {
            std::string out;
            machina::encode_ds_state({machina::DsReport::Mode::full, s.as_changes()}, out);
            return out;
          },
          "The full state as JSON text ({\"slots\": {...}}).");

  py::class_<machina::ToolHost>(m, "Host", "The host: load plugins, then call tools. Thread-safe.")
      .def(py::init(
               [](const py::kwargs& options) { return std::make_unique<machina::ToolHost>(make_options(options)); }),
           "Host(**options): the options of machina_dispatch.host_options(), each defaulting to the core's own.")
      .def("load_plugin", &machina::ToolHost::load_plugin, "path"_a,
           "Loads a plugin library; returns the aids it added. Raises HostError naming the file.")
      .def("load_tools", &machina::ToolHost::load_tools, "path"_a, py::call_guard<py::gil_scoped_release>(),
           "Loads the tools a TOML tool manifest declares; returns the aids it added. Raises HostError naming "
           "file, line and field.")
      .def(
          "add_packs",
          [](machina::ToolHost& host, const std::vector<std::string>& packs, const std::optional<std::string>& policy) {
            machina::Policy p = policy
                                    ? machina::load_policy(*policy,
                                                           [] {
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
          [](machina::ToolHost& h, const std::string& request, machina::Session& session, const std::string& aid,
             const std::string& front) {
            std::string out;
            machina::ndjson::respond(h.host(), request, session, out, nullptr, aid, /*nul_terminated=*/true,
                                     front_named(front));
            out.pop_back();  // the trailing newline belongs to the NDJSON framing
            return out;
          },
          "request"_a, "session"_a, "aid"_a = "", "front"_a = "python", py::call_guard<py::gil_scoped_release>(),
          "Handles one JSON request exactly as --serve would (with `aid`: as --run would); returns the response JSON. "
          "`front` names the front the audit store records (python, nats, http, ...).")
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
