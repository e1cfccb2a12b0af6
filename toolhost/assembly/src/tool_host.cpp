// The tool host: the pipeline and the runners it is assembled from (see tool_host.hpp).
// Manifest tools are loaded in manifest_tools.cpp, plugin libraries in plugin_library.cpp,
// the default tool set in default_tools.cpp and the reach of the tools is checked in
// tool_reach.cpp.
#include <machina/runners/hosted_server.hpp>
#include <machina/tool_host.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace machina {

HostOptions ToolHost::prepared(HostOptions options) {
  if (options.lease_enforce) refuse_key_file_in_workspace();
  // The commands of this package (the executable is installed beside the Python module).
  auto& commands = options.operator_commands;
  if (commands.tool_list.empty()) commands.tool_list = "--list";
  if (commands.lease_issue.empty()) commands.lease_issue = "machina-toolhost lease issue --aid";
  if (commands.audit_store.empty()) commands.audit_store = "--audit-db FILE";
  if (options.isolation == Isolation::process) {
    options.workers.max_output_bytes = options.max_output_bytes;
    options.workers.max_request_bytes = options.max_request_bytes;
    // Tools never see the lease key file, wherever it is.
    if (const char* key_file = std::getenv("MACHINA_LEASE_KEY_FILE"); key_file != nullptr && *key_file != '\0') {
      options.workers.hidden_files.emplace_back(key_file);
    }
  }
  return options;
}

ToolHost::ToolHost(HostOptions options)
    : host_(prepared(std::move(options)), Host::Hooks{[this](const std::string& id) { connection_opened(id); },
                                                      [this](const std::string& id) { connection_closed(id); }}),
      inline_(host_.options().max_stuck_calls, host_.options().on_event) {
  host_.set_stuck_counter(&inline_.stuck_counter());
  if (host_.options().isolation == Isolation::process) {
    process_ = std::make_unique<ProcessRunner>(host_.options().workers);
  }
}

ToolHost::~ToolHost() = default;

Runner* ToolHost::plugin_runner() {
  if (process_) return process_.get();
  return &inline_;
}

std::vector<std::string> ToolHost::add_packs(const std::vector<std::string>& packs, Policy policy) {
  std::lock_guard lock(manifest_mu_);
  if (packs_) throw ConfigError("the tool packs are already registered");
  for (const auto& p : packs) {
    const auto& known = PackRunner::pack_names();
    if (std::find(known.begin(), known.end(), p) == known.end()) {
      std::string names;
      for (const auto& k : known) names += (names.empty() ? "" : ", ") + k;
      throw ConfigError("unknown tool pack '" + p + "' (there are: " + names + ")");
    }
  }
  if (host_.audit() != nullptr) {
    try {
      keep_audit_out_of_reach(policy);
    } catch (const ConfigError& e) {
      // The default store where the tools reach it: not kept, rather than the host stopped.
      const AuditOptions& audit = host_.options().audit;
      if (!audit.optional || !audit.jsonl_path.empty()) throw;
      std::fprintf(stderr, "machina-toolhost: %s; running without the audit store (%s: a store elsewhere)\n", e.what(),
                   host_.options().operator_commands.audit_store.c_str());
      host_.drop_audit();
    }
  }
  auto runner = std::make_unique<PackRunner>(std::move(policy), host_.options().workers.executable);
  const auto added =
      host_.registry_to_fill().add_described("tool packs", runner->tools(packs), runner.get(), /*host_own=*/true);
  packs_ = std::move(runner);
  return added;
}

std::vector<std::string> ToolHost::add_linked_plugin(PluginEntryPoints entry) {
  ToolRegistry& registry = host_.registry_to_fill();
  auto added = registry.add_plugin(std::string(kLinkedPluginSource), entry, plugin_runner());
  if (process_) {
    std::vector<ToolInfo> infos;
    for (const auto& aid : added) infos.push_back(registry.find(aid)->info);
    process_->add_linked(infos);
  }
  return added;
}

std::vector<std::shared_ptr<HostedServer>> ToolHost::hosted_servers() const {
  std::lock_guard lock(manifest_mu_);
  return toolsets_;
}

void ToolHost::connection_opened(const std::string& id) {
  for (auto& t : hosted_servers()) t->session_started(id);
}

void ToolHost::connection_closed(const std::string& id) {
  for (auto& t : hosted_servers()) t->session_ended(id);
}

ToolHostStats ToolHost::stats() const {
  const HostStats pipeline = host_.stats();
  ToolHostStats s;
  s.calls = pipeline.calls;
  s.timeouts = pipeline.timeouts;
  s.crashes = pipeline.crashes;
  s.stuck_now = inline_.stuck_now();
  s.stuck_peak = inline_.stuck_peak();
  if (process_) s.workers = process_->stats();
  return s;
}

void ToolHost::close() {
  if (process_) process_->close();
  {
    std::lock_guard lock(manifest_mu_);
    if (packs_) packs_->close();
    for (auto& runner : manifest_runners_) runner->close();
  }
  host_.flush_audit();  // what was recorded is in the store once the owner is done with the host
}

}  // namespace machina
