// The tool host: a Host (the rule pipeline) assembled from its options with every runner its
// tools need. It builds the runners (inline, process, packs, Python worker pools, HTTP
// services, skills and MCP servers), loads plugins, packs and tool manifests into the host's
// registry, starts the hosted servers, and keeps the audit store and the lease key file out
// of the tools' reach. Fronts are handed host(); the owner of the process keeps the ToolHost.
#pragma once

#include <machina/host.hpp>
#include <machina/http_client.hpp>
#include <machina/policy.hpp>
#include <machina/runners/inline_runner.hpp>
#include <machina/runners/pack_runner.hpp>
#include <machina/runners/process_runner.hpp>
#include <machina/runners/python_runner.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace machina {

class HostedServer;
class ToolHost;
struct ManifestChild;
struct ToolManifest;

/// The file name of the built-in plugin (the built-in tools as a plugin library).
inline constexpr std::string_view kBuiltinPluginFile = "machina_builtin_tools.so";

/// The tools a front was asked for. One rule makes the default set (load_default_tools):
/// no plugin named means the built-in tools plus every tool pack.
struct ToolChoice {
  /// Plugin libraries to load; unset: the built-in tools.
  std::optional<std::vector<std::string>> plugins;
  /// Tool packs to register (PackRunner::pack_names()); unset: every pack when no plugin is
  /// named, none when one is; empty: none.
  std::optional<std::vector<std::string>> packs;
  /// The packs' policy file; "": $MACHINA_TOOLHOST_POLICY, else the safe defaults.
  std::string policy_file;
  /// Tool manifests to load, in order, after the plugins and packs.
  std::vector<std::string> manifests;
  /// The built-in tools: linked into the program (its entry points), else the built-in
  /// plugin library at `builtin_plugin`.
  std::optional<PluginEntryPoints> linked_builtin;
  std::string builtin_plugin;
  /// How plugin libraries are loaded: &ToolHost::load_plugin in a program that may load
  /// them; null in one that links its tools in (the static build: no dynamic loading in it).
  std::vector<std::string> (ToolHost::*load_library)(const std::string& path) = nullptr;
};

/// Whether the tools chosen need a program that loads plugin libraries (one is named).
bool loads_plugin_libraries(const ToolChoice& choice);

/// The tool packs' policy: the file named, else $MACHINA_TOOLHOST_POLICY, else the safe
/// defaults (policy.hpp), for the workspace $MACHINA_TOOLHOST_WORKSPACE says.
Policy pack_policy(const std::string& policy_file);

/// The pipeline's counters and those of the runners the tool host owns.
struct ToolHostStats {
  std::uint64_t calls = 0;      // tool runs started
  std::uint64_t timeouts = 0;   // calls answered `timeout`
  std::uint64_t crashes = 0;    // calls answered `tool_crashed`
  std::uint64_t stuck_now = 0;  // inline: threads still inside a tool past its deadline
  std::uint64_t stuck_peak = 0;
  ProcessRunner::Stats workers;  // process isolation
};

class ToolHost {
 public:
  /// Throws ConfigError as Host does, and if the lease key file lies inside the tools'
  /// workspace (with lease enforcement on).
  explicit ToolHost(HostOptions options = {});
  ~ToolHost();
  ToolHost(const ToolHost&) = delete;
  ToolHost& operator=(const ToolHost&) = delete;

  /// The pipeline, for the fronts.
  Host& host() { return host_; }
  const Host& host() const { return host_; }
  const ToolRegistry& registry() const { return host_.registry(); }

  /// Registers the tools `choice` names, by the one rule for the default set: the plugins
  /// named, else the built-in tools; the packs named, else every pack when no plugin is
  /// named; then the manifests. Throws ConfigError as the loaders below do. Returns the aids
  /// added.
  std::vector<std::string> load_default_tools(const ToolChoice& choice);
  /// Throws ConfigError naming the file (see ToolRegistry::load_plugin), or if process
  /// isolation has already started its workers. With process isolation the library is
  /// loaded in a sandboxed worker, never in this process (ProcessRunner::describe).
  std::vector<std::string> load_plugin(const std::string& path);
  /// Registers tools linked into this program (machina-toolhost's built-in pack). Isolated
  /// workers, being this program too, are told to do the same (`--linked-tools`).
  std::vector<std::string> add_linked_plugin(PluginEntryPoints entry);
  /// Registers the tools a tool manifest declares (tool_manifest.hpp), each with the runner
  /// its kind needs (Python tools: warm worker pools, shared by tools of one interpreter and
  /// set-up). Throws ConfigError "FILE:LINE: …" for a bad manifest or an interpreter that is
  /// not there, or naming the aid already registered; registers all of the file's tools or
  /// none. Returns the aids added.
  std::vector<std::string> load_tools(const std::string& manifest_path);
  /// Registers the built-in tool packs (`packs`: of PackRunner::pack_names(); empty: all)
  /// under each tool's every name, run in this process under `policy`. Throws ConfigError
  /// for an unknown pack, a name already registered, or packs added before.
  std::vector<std::string> add_packs(const std::vector<std::string>& packs, Policy policy);

  /// A connection of a front's opened or closed: the hosted skills are told
  /// (lifecycle/onSessionStart, onSessionEnd). Fronts reach these through host().
  void connection_opened(const std::string& id);
  void connection_closed(const std::string& id);

  ToolHostStats stats() const;

  /// Ends the isolated worker processes, Python workers, skills and MCP servers (calls
  /// running in them fail with `tool_crashed`; later calls fail too) and writes out the
  /// audit store. Inline tools are unaffected. For owners that must release processes
  /// before the tool host itself goes away.
  void close();

 private:
  /// The runner for native plugin tools (the isolation option chooses).
  Runner* plugin_runner();
  /// Refuses a lease key file the file tools could read (with lease enforcement on).
  static void refuse_key_file_in_workspace();
  /// Refuses tool roots that hold the audit store's files, and protects those files by
  /// identity under `policy`.
  void keep_audit_out_of_reach(Policy& policy) const;
  /// The interpreter a skill directory with a requirements.txt runs with: its environment's
  /// (made or reused), in place of `program`, its command's Python.
  std::string skill_python(const ToolManifest& manifest, const ManifestChild& c, const std::string& program) const;
  /// Starts a manifest's skills and MCP servers and describes their tools (all or none).
  std::vector<std::shared_ptr<HostedServer>> start_children(const ToolManifest& manifest,
                                                            std::vector<ToolRegistry::Described>& described,
                                                            std::vector<std::unique_ptr<Runner>>& runners);
  /// Opens the session of an MCP server reached by its URL and describes its tools.
  void add_remote_server(const ToolManifest& manifest, const ManifestChild& c,
                         std::vector<ToolRegistry::Described>& described,
                         std::vector<std::unique_ptr<Runner>>& runners);
  /// The skills and MCP servers started so far (a copy: told of connections without the lock).
  std::vector<std::shared_ptr<HostedServer>> hosted_servers() const;
  /// The options as the host (which checks them) and the process runner use them: the caps
  /// handed to the isolated workers, the lease key file hidden from them.
  static HostOptions prepared(HostOptions options);

  // Destroyed bottom up: the inline runner's watchdog stops first (its callbacks reach into
  // the host), then the host with its registry (whose tools point at the runners), then
  // the runners.
  std::unique_ptr<ProcessRunner> process_;
  std::unique_ptr<PackRunner> packs_;
  mutable std::mutex manifest_mu_;                         // one load_tools() at a time; guards the runners below
  std::vector<std::unique_ptr<Runner>> manifest_runners_;  // a runner per manifest tool
  std::map<std::string, std::shared_ptr<PythonWorkerPool>> python_pools_;  // by interpreter and set-up
  std::map<std::string, std::shared_ptr<http::Client>> http_clients_;      // HTTP tool services, by origin
  std::vector<std::shared_ptr<HostedServer>> toolsets_;                    // skills and MCP servers
  Host host_;
  InlineRunner inline_;
};

}  // namespace machina
