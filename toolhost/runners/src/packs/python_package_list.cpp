// See python_pack.hpp: list_python_packages, what a workspace's interpreter has installed
// (read in the workspace's walls), or, where code cannot be confined, what the policy's
// interpreter offers of its own (read with no site initialisation, so no installed code runs).
#include "python_pack.hpp"

#include <machina/child_process.hpp>
#include <machina/clock.hpp>
#include <machina/errors.hpp>
#include <machina/runners/python_interpreter.hpp>
#include <machina/tool_protocol.hpp>

#include <algorithm>
#include <chrono>

namespace machina::packs {
namespace {

using json = nlohmann::json;

constexpr const char* kEntryList = "machina_python_exec:list_packages";

// The distributions of an interpreter's own site folders, as JSON on stdout: read without
// the site initialisation (-S), so that no installed package's code runs.
constexpr const char* kListWithoutSite = R"(import json, site, sys
from importlib import metadata
found = {}
for d in metadata.distributions(path=site.getsitepackages()):
    name = d.metadata["Name"] if d.metadata is not None else None
    if name:
        found.setdefault("-".join(name.lower().replace("_", "-").replace(".", "-").split("-")),
                         {"name": name, "version": d.version or ""})
out = sorted(found.values(), key=lambda p: p["name"].lower())
print(json.dumps({"python": sys.executable, "packages": out[:10000], "truncated": len(out) > 10000}))
)";

/// The `packages` of a listing: each one's name and version, and with `installed` (the
/// detailed shape) whether the workspace installed it (never, with no workspace).
json package_entries(const json& listed, bool installed, bool workspace) {
  json packages = json::array();
  for (const auto& pkg : listed) {
    json entry = {{"name", pkg.value("name", std::string())}, {"version", pkg.value("version", std::string())}};
    if (installed) entry["installed"] = workspace && pkg.value("installed", false);
    packages.push_back(std::move(entry));
  }
  return packages;
}

}  // namespace

Result PythonPack::list_without_workspace(const Call& c) {
  std::string python;
  try {
    python = resolve_interpreter(policy_.python.python, ".");
  } catch (const ConfigError& e) {
    return system_error(std::string("the Python interpreter of the policy ([python] python): ") + e.what());
  }
  ChildSpec spec;
  spec.executable = python;
  spec.argv = {python, "-I", "-S", "-c", kListWithoutSite};
  spec.env = pick_environment({"PATH", "LANG"});
  const auto left = std::max<std::int64_t>(1, c.spec.deadline_ms - steady_now_ms());
  const auto ran = run_to_completion(spec, "", std::chrono::milliseconds(left), 8 << 20);
  json answer = ran.ended == ChildOutcome::Ended::exited && ran.exit_code == 0
                    ? json::parse(ran.stdout_text, nullptr, false)
                    : json();
  if (!answer.is_object() || !answer.contains("packages") || !answer["packages"].is_array()) {
    return system_error("the packages could not be listed: python " + ran.how +
                        (ran.tail.empty() ? "" : ": " + ran.tail.substr(0, 2000)));
  }
  json o = {{"success", true},
            {"packages", package_entries(answer["packages"], c.shape == Shape::detailed, /*workspace=*/false)}};
  if (c.shape == Shape::detailed) {
    o["python"] = answer.value("python", python);
    o["environment"] = nullptr;
    o["truncated"] = answer.value("truncated", false);
  }
  return Result::ok(std::move(o));
}

Result PythonPack::list(const Call& c) {
  // Where code cannot be confined nothing is made ready, but what the interpreter offers
  // can still be read.
  if (!unconfinable().empty()) return list_without_workspace(c);
  Result refusal;
  Workspace* ws = workspace(c, refusal);
  if (ws == nullptr) return refusal;
  auto pool = stateless_pool(*ws);
  const std::string payload = json{{"cwd", ws->calls}}.dump();
  std::string line;
  tool_protocol::encode_local_call(
      {"list_python_packages", kEntryList, payload, true, c.spec.trace_id, {}, c.spec.deadline_ms}, line);
  line.push_back('\n');
  const PythonWorkerPool::Exchange ex = pool->call(line, c.spec.deadline_ms, c.spec.cancel);
  using Ending = PythonWorkerPool::Exchange::Ending;
  switch (ex.ending) {
    case Ending::answered: break;
    case Ending::timed_out: return Result::stopped(RunOutcome::Ending::timed_out, ex.detail);
    case Ending::cancelled: return Result::stopped(RunOutcome::Ending::cancelled, ex.detail);
    case Ending::closed: return Result::stopped(RunOutcome::Ending::closed);
    case Ending::crashed: return system_error("the workspace's interpreter ended: " + ex.detail.substr(0, 2000));
  }
  json answer;
  std::string why;
  if (!decode_code_runner_answer(ex, answer, why))
    return system_error("the packages could not be listed: " + why.substr(0, 2000));
  json o = {{"success", true},
            {"packages", package_entries(answer.value("packages", json::array()), c.shape == Shape::detailed,
                                         /*workspace=*/true)}};
  if (c.shape == Shape::detailed) {
    o["python"] = answer.value("python", std::string());
    o["environment"] = ws->env;
    o["truncated"] = answer.value("truncated", false);
  }
  return Result::ok(std::move(o));
}

}  // namespace machina::packs
