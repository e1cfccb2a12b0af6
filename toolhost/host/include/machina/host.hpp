// The host: one thread-safe request handler that applies every rule in a fixed order
// (tool lookup, lease gate, idempotency, breaker, input validation, run, output cap,
// ds_state delta) for every front.
#pragma once

#include <machina/audit.hpp>
#include <machina/circuit_breaker.hpp>
#include <machina/clock.hpp>
#include <machina/host_options.hpp>
#include <machina/http_client.hpp>
#include <machina/idempotency_cache.hpp>
#include <machina/lease.hpp>
#include <machina/policy.hpp>
#include <machina/request.hpp>
#include <machina/runner.hpp>
#include <machina/runners/inline_runner.hpp>
#include <machina/runners/pack_runner.hpp>
#include <machina/runners/process_runner.hpp>
#include <machina/runners/python_runner.hpp>
#include <machina/tool_registry.hpp>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

namespace machina {

class JsonRpcToolset;
struct ToolManifest;

inline constexpr std::string_view kBuiltinPluginFile = "machina_builtin_tools.so";

/// How a front answers on time when a tool overruns its deadline on the front's own
/// thread (inline mode): see Host::handle.
class Takeover {
 public:
  virtual ~Takeover() = default;
  /// Called once, on the host's watchdog thread, with the `timeout` response to deliver
  /// now. The thread that called handle() stays inside the tool until the tool returns;
  /// its handle() then returns a response marked `abandoned`, which the front drops.
  virtual void deliver_overrun(Response response) = 0;
};

struct HostStats {
  std::uint64_t calls = 0;      // tool runs started
  std::uint64_t timeouts = 0;   // calls answered `timeout`
  std::uint64_t crashes = 0;    // calls answered `tool_crashed`
  std::uint64_t stuck_now = 0;  // inline: threads still inside a tool past its deadline
  std::uint64_t stuck_peak = 0;
  ProcessRunner::Stats workers;  // process isolation
};

class Host {
 public:
  /// Throws HostError if lease enforcement is on and no usable secret is configured.
  explicit Host(HostOptions options = {});
  ~Host();
  Host(const Host&) = delete;
  Host& operator=(const Host&) = delete;

  /// Throws HostError naming the file (see ToolRegistry::load_plugin), or if process
  /// isolation has already started its workers. With process isolation the library is
  /// loaded in a sandboxed worker, never in this process (ProcessRunner::describe).
  std::vector<std::string> load_plugin(const std::string& path);
  /// Registers tools linked into this program (machina-toolhost's built-in pack). Isolated
  /// workers, being this program too, are told to do the same (`--linked-tools`).
  std::vector<std::string> add_linked_plugin(PluginEntryPoints entry);
  /// Registers the tools a tool manifest declares (tool_manifest.hpp), each with the runner
  /// its kind needs (Python tools: warm worker pools, shared by tools of one interpreter and
  /// set-up). Throws HostError "FILE:LINE: …" for a bad manifest or an interpreter that is
  /// not there, or naming the aid already registered; registers all of the file's tools or
  /// none. Returns the aids added.
  std::vector<std::string> load_tools(const std::string& manifest_path);
  /// Registers the built-in tool packs (`packs`: of PackRunner::pack_names(); empty: all)
  /// under each tool's every name, run in this process under `policy`. Throws HostError
  /// for an unknown pack, a name already registered, or packs added before.
  std::vector<std::string> add_packs(const std::vector<std::string>& packs, Policy policy);
  /// A session of a front's began or ended (a --serve stream, an MCP or skill connection,
  /// a Python transport): the hosted skills are told (lifecycle/onSessionStart, onSessionEnd).
  void session_started(const std::string& id);
  void session_ended(const std::string& id);
  const ToolRegistry& registry() const { return registry_; }
  const HostOptions& options() const { return options_; }

  /// Runs one request, applying every rule (see docs/protocol.md, the order of rules: the request's size, its
  /// `aid` and `timeout_ms`, then lookup, lease gate, idempotency, breaker, input
  /// validation, the run with its deadline, output cap, ds_state). Never throws; always
  /// returns exactly one response.
  ///
  /// Every call has a deadline. In process isolation the worker is killed at the deadline
  /// and the call answers `timeout` on time. Inline, the tool runs on this thread, which
  /// nothing can safely stop: with a `takeover`, the host hands the `timeout` response to
  /// it at the deadline (and later returns an `abandoned` response here); without one,
  /// the `timeout` response is returned here once the tool gives the thread back.
  Response handle(Request& request, Session& session, Takeover* takeover = nullptr);

  /// The response for a request refused by size before it was decoded.
  Response request_too_large() const;

  /// Keeps the answers of calls with an idempotency key in `store` (one shared by a group of
  /// hosts) rather than in this host's own cache; null: the host's own cache again. The same
  /// rules hold either way (see run_keyed). Call it before the first call is handled.
  void set_idempotency_store(std::shared_ptr<IdempotencyStore> store) { shared_store_ = std::move(store); }

  /// Entries of the host's own cache.
  std::size_t idempotency_entries() const { return idempotency_.size(); }
  HostStats stats() const;

  /// Ends the isolated worker processes (calls running in them fail with
  /// `tool_crashed`; later isolated calls fail too) and writes out the audit store. Inline
  /// tools are unaffected. For owners that must release processes before the host object
  /// itself goes away.
  void close();
  /// The audit store (null unless HostOptions::audit names one). Its files are out of every
  /// tool pack's reach (add_packs refuses roots that hold them).
  AuditLog* audit() const { return audit_.get(); }
  /// Writes out what the audit store has been given (before a quick exit).
  void flush_audit() const {
    if (audit_) audit_->flush();
  }

  /// Inline calls still running past their deadline (cheap; see HostStats::stuck_now).
  std::uint64_t stuck_calls() const { return inline_.stuck_now(); }

  /// The deadline a request for `tool` gets, in milliseconds.
  std::int64_t timeout_for(const Tool& tool, const Request& request) const;

 private:
  /// The refusal of a call to an aid no tool has: the nearest aid as its hint.
  Response tool_not_found(std::string_view aid) const;
  struct Scope;

  Response handle_checked(Request& request, Session& session, Takeover* takeover, std::int64_t started_ns);
  AuditCall audit_call(const Request& request, const Response& response, std::int64_t started_ns) const;
  void record_call(const Request& request, const Response& response, std::int64_t started_ns) const;
  /// Records the call; one the store must record (AuditOptions::required) is first written,
  /// and if that fails `r` becomes audit_unavailable (its output withheld).
  void record_or_withhold(const Request& request, Session& session, Response& r, std::int64_t started_ns) const;
  /// Runs the call into `r` (a fresh Response, the caller's return object).
  void execute(const Tool& tool, const Request& request, Session& session, std::int64_t now_ms, Scope& scope,
               Response& r);
  /// A call with an idempotency key: `store` first, then execute(). The store is the host's
  /// own cache, called as itself (no indirect call on a fresh key's path), or a shared store
  /// through the interface; the rule is this one function either way.
  template <class Store>
  void run_keyed(Store& store, const Tool& tool, const Request& request, Session& session, std::int64_t now_ms,
                 Scope& scope, Response& r);
  /// run_keyed's answer for a key already known (a hit, a wait, a conflict), a full cache, or
  /// one the store gives: false once `r` is the answer; true when the call is to run after
  /// all (a `wait` ended with the key free: `ticket` is then this call's `run`).
  [[gnu::noinline]] bool answer_without_running(IdempotencyStore& store, const Tool& tool, Session& session,
                                                IdempotencyStore::Ticket& ticket, Response& r);
  DsReport report(Session& session, std::shared_ptr<const SlotChanges> changes) const;
  Response timeout_response(const Tool& tool, std::int64_t timeout_ms, const std::string& detail = {}) const;
  void refuse_key_file_in_workspace() const;
  void keep_audit_out_of_reach(Policy& policy) const;
  /// The runner for native plugin tools (the isolation option chooses).
  Runner* plugin_runner();
  /// Starts a manifest's skills and MCP servers and describes their tools (all or none).
  std::vector<std::shared_ptr<JsonRpcToolset>> start_children(const ToolManifest& manifest,
                                                              std::vector<ToolRegistry::Described>& described,
                                                              std::vector<std::unique_ptr<Runner>>& runners);
  void event(const std::string& line) const;

  HostOptions options_;
  std::unique_ptr<AuditLog> audit_;  // goes last of all: runners may record until they stop
  IdempotencyCache idempotency_;
  std::shared_ptr<IdempotencyStore> shared_store_;  // set: used in place of idempotency_
  std::unique_ptr<LeaseAuthority> leases_;
  std::atomic<std::uint64_t> calls_{0}, timeouts_{0}, crashes_{0};

  // The runners outlive the registry's tools that point at them, and the inline runner's
  // watchdog stops (first, in its destructor) before anything its callbacks use goes.
  std::unique_ptr<ProcessRunner> process_;
  std::unique_ptr<PackRunner> packs_;
  std::mutex manifest_mu_;                                                 // one load_tools() at a time
  std::vector<std::unique_ptr<Runner>> manifest_runners_;                  // a runner per manifest tool
  std::map<std::string, std::shared_ptr<PythonWorkerPool>> python_pools_;  // by interpreter and set-up
  std::map<std::string, std::shared_ptr<http::Client>> http_clients_;      // HTTP tool services, by origin
  std::vector<std::shared_ptr<JsonRpcToolset>> toolsets_;                  // skills and MCP servers
  ToolRegistry registry_;
  InlineRunner inline_;
};

}  // namespace machina
