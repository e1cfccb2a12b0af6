// Host::load_tools: the tools of a tool manifest, each registered with the runner its kind
// needs. Python tools share a pool of warm workers per interpreter and set-up (import root,
// environment, sandbox, limits).
#include <machina/errors.hpp>
#include <machina/host.hpp>
#include <machina/http_client.hpp>
#include <machina/python_sandbox.hpp>
#include <machina/runners/service_runner.hpp>
#include <machina/tool_manifest.hpp>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>

namespace machina {
namespace {

/// The error of a tool's field, as the manifest loader words its own.
[[noreturn]] void refuse_field(const ToolManifest& m, const ManifestTool& t, std::size_t index, const std::string& field,
                               const std::string& why) {
  throw HostError(m.path + ":" + std::to_string(t.line) + ": tool " + std::to_string(index) + " (" + t.info.aid +
                  "): field '" + field + "': " + why);
}

std::string capability_context(const ManifestTool& t, const std::string& runner) {
  nlohmann::ordered_json guarantees = nlohmann::ordered_json::object();
  for (const auto& [name, required] : t.guarantees) guarantees[name] = required;
  nlohmann::ordered_json c = {{"tool_name", t.info.name},
                              {"resolved_source", "binding"},
                              {"runner", runner},
                              {"protocol_version", 1},
                              {"guarantees", guarantees},
                              {"sources", nlohmann::ordered_json::object()}};
  for (const auto& [name, required] : t.guarantees) c["sources"][name] = "tool";
  if (!t.write_root.empty()) c["filesystem_root"] = t.write_root;
  if (!t.read_roots.empty()) c["filesystem_read_roots"] = t.read_roots;
  return c.dump();
}

}  // namespace

std::vector<std::string> Host::load_tools(const std::string& manifest_path) {
  const ToolManifest manifest = load_tool_manifest(manifest_path);
  std::lock_guard lock(manifest_mu_);
  std::vector<std::unique_ptr<Runner>> runners;
  std::map<std::string, std::shared_ptr<PythonWorkerPool>> new_pools;
  std::vector<ToolRegistry::Described> described;
  std::size_t index = 0;
  for (const ManifestTool& t : manifest.tools) {
    ++index;
    if (t.runner == "python") {
      std::string python;
      try {
        python = resolve_interpreter(t.python, t.root);
      } catch (const HostError& e) {
        refuse_field(manifest, t, index, "python", e.what());
      }
      const std::uint64_t memory_mb = t.memory_mb != 0 ? t.memory_mb : options_.python_memory_mb;
      SandboxPlan plan;
      try {
        plan = plan_python_sandbox(t, python, options_.workers.executable, memory_mb);
      } catch (const HostError& e) {
        refuse_field(manifest, t, index, "python", e.what());
      }
      PythonPoolOptions po;
      po.python = plan.interpreter.empty() ? python : plan.interpreter;
      po.roots = {t.root};
      std::vector<std::string> pass(std::begin(kWorkerEnvironment), std::end(kWorkerEnvironment));
      pass.insert(pass.end(), options_.workers.pass_env.begin(), options_.workers.pass_env.end());
      pass.insert(pass.end(), t.env.begin(), t.env.end());
      po.env = plan.empty_environment ? std::vector<std::string>{} : pick_environment(pass);
      po.launcher = plan.launcher;
      po.workers = t.workers != 0 ? t.workers : std::max<std::size_t>(1, options_.python_workers);
      po.memory_mb = memory_mb;
      // The output cap, and room for the trace (what the tool printed: 64 KiB a stream).
      po.max_answer_bytes = options_.max_output_bytes + (1u << 20);
      po.on_event = options_.on_event;
      // Tools that would start their workers alike share them.
      std::string key = po.python + '\n' + t.root + '\n' + plan.key + '\n' + std::to_string(po.workers) + '\n' +
                        std::to_string(po.memory_mb);
      for (const auto& e : po.env) key += '\n' + e;
      std::shared_ptr<PythonWorkerPool> pool;
      if (auto it = python_pools_.find(key); it != python_pools_.end()) pool = it->second;
      else if (auto jt = new_pools.find(key); jt != new_pools.end()) pool = jt->second;
      else pool = new_pools.emplace(key, std::make_shared<PythonWorkerPool>(po)).first->second;
      PythonRunner::ToolFields fields;
      fields.name = t.info.name;
      fields.entry = t.entry;
      fields.sandbox = t.sandbox;
      fields.capability_context_json = capability_context(t, "local");
      fields.enforcement_json = plan.enforcement_json;
      fields.refusal = plan.refusal;
      runners.push_back(std::make_unique<PythonRunner>(pool, std::move(fields)));
    } else if (t.runner == "service") {
      http::Url url;
      std::string why;
      if (!http::Url::parse(t.url, url, why)) refuse_field(manifest, t, index, "url", why);
      ServiceToolFields fields;
      fields.url = t.url;
      fields.name = t.info.name;
      fields.entry = t.entry;
      fields.guarantees = t.guarantees;
      fields.unsafe_override = t.unsafe_override;
      if (!t.token_env.empty()) {
        const char* token = std::getenv(t.token_env.c_str());
        if (token == nullptr || *token == '\0') {
          refuse_field(manifest, t, index, "token_env", "the variable " + t.token_env + " is not set");
        }
        fields.token = token;
      }
      fields.app_root = t.root.empty() ? std::filesystem::path(manifest.path).parent_path().string() : t.root;
      fields.max_answer_bytes = options_.max_output_bytes + (1u << 20);
      std::shared_ptr<http::Client>& client = http_clients_[url.origin()];
      if (!client) client = std::make_shared<http::Client>(url);
      runners.push_back(std::make_unique<ServiceRunner>(client, std::move(fields)));
    } else {
      refuse_field(manifest, t, index, "runner", "'" + t.runner + "' tools are not supported by this build yet");
    }
    described.push_back({t.info, runners.back().get()});
  }
  auto added = registry_.add_described(manifest.path, described, "tool manifest");
  for (auto& r : runners) manifest_runners_.push_back(std::move(r));
  for (auto& [key, pool] : new_pools) python_pools_.emplace(key, std::move(pool));
  return added;
}

}  // namespace machina
