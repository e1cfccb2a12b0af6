// Tools served by a child process over JSON-RPC 2.0 (a hosted server): a skill (initialize ->
// tools, tools/call, lifecycle/* and shutdown; or the skill/* names) or an MCP
// server over stdio (initialize, notifications/initialized, tools/list pages, tools/call).
// One hosted server per child, one runner per tool it offers; many calls in flight on the child,
// matched by id. The child's requests are answered: a skill's state/get and state/set from
// the ds_state of its call in flight, data/read and data/write beneath its data directory,
// ping; anything else is refused (-32601), never left hanging.
//
// Supervision: a call past its deadline is answered `timeout` on time and the child is told
// (notifications/cancelled), then asked to answer a ping: a child that does not, hangs, and
// is killed. A child that crashes, writes something that is not JSON-RPC or a message over
// the cap fails the calls in flight on it (`tool_crashed`, with the tail of its stderr) and
// is started again at the next call, after a back-off that doubles with each failure to
// start (from 100 ms to 30 s).
#pragma once

#include <machina/rpc_child.hpp>
#include <machina/runner.hpp>

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace machina {

struct HostedServerOptions {
  /// A skill that answers lifecycle/* and shutdown, one that answers skill/*, or an MCP server.
  enum class Dialect { lifecycle_skill, runtime_skill, mcp };
  Dialect dialect = Dialect::lifecycle_skill;
  std::string name;  // the skill's or server's (for messages)
  RpcChildOptions child;
  std::int64_t start_timeout_ms = 30'000;  // to start and say what tools it has
  std::int64_t tick_interval_ms = 0;       // skills: a tick this often (0: none)
  std::string data_dir;                    // skills: data/read and data/write beneath it ("": refused)
  std::string skill_manifest_json;         // skill/load's `manifest` (runtime skills)
  std::int64_t shutdown_grace_ms = 2'000;  // at close: how long it may take to leave
  std::int64_t probe_timeout_ms = 2'000;   // after a timeout: how long a ping may take
  std::size_t max_data_bytes = 1u << 20;   // data/read and data/write, at most
  EventSink on_event;
};

/// A tool as the child describes it.
struct RemoteTool {
  std::string name;
  std::string title;
  std::string description;
  std::string input_schema;   // JSON text ("" for none)
  std::string output_schema;  // JSON text ("" for none)
  std::string annotations;    // JSON object text ("" for none)
};

class HostedServer {
 public:
  explicit HostedServer(HostedServerOptions options);
  ~HostedServer();
  HostedServer(const HostedServer&) = delete;
  HostedServer& operator=(const HostedServer&) = delete;

  /// Starts the child and asks it for its tools. Throws ConfigError saying why if it cannot be
  /// started or does not answer as its protocol says within start_timeout_ms.
  std::vector<RemoteTool> start();
  /// One call of the child's tool `tool`.
  RunOutcome call(const RunSpec& spec, const std::string& tool);
  /// A session of the host's began or ended: skills are told (lifecycle/onSessionStart,
  /// onSessionEnd, or skill/sessionStart, skill/sessionEnd).
  void session_started(const std::string& id);
  void session_ended(const std::string& id);
  /// Asks the child to leave (shutdown, then a grace period, then a kill). Idempotent.
  void close();
  std::string_view kind() const { return options_.dialect == HostedServerOptions::Dialect::mcp ? "mcp" : "skill"; }
  const HostedServerOptions& options() const { return options_; }
  /// The child now serving (null when none runs): for tests and stats.
  pid_t pid() const;

 private:
  struct InFlight;
  std::shared_ptr<RpcChild> live_child(std::int64_t deadline_ms, std::string& why);
  /// `modern`: whether the child (an MCP server) speaks the 2026-07-28 revision.
  std::shared_ptr<RpcChild> launch(std::int64_t deadline_ms, std::vector<RemoteTool>* tools, std::string& why,
                                   bool& modern);
  void on_request(const jsonrpc::Message& request, std::string& reply);
  void on_notification(const jsonrpc::Message& notification);
  void answer_state(const jsonrpc::Message& request, std::string& reply);
  void answer_data(const jsonrpc::Message& request, std::string& reply);
  void lifecycle(const char* lifecycle_method, const char* skill_method, const std::string& params);
  void lifecycle_on(const std::shared_ptr<RpcChild>& child, const char* lifecycle_method, const char* skill_method,
                    const std::string& params);
  void background_loop();

  HostedServerOptions options_;
  Spawner spawner_;  // children die with the host (PR_SET_PDEATHSIG on this thread)
  mutable std::mutex mu_;
  std::shared_ptr<RpcChild> child_;
  bool child_modern_ = false;  // child_ speaks MCP 2026-07-28: every request carries the envelope
  int failures_ = 0;           // starts that failed or children that ended, in a row
  std::int64_t next_start_ms_ = 0;
  std::string last_end_;  // how the last child ended
  bool closed_ = false;
  std::set<std::string> sessions_;               // under way (told again to a skill started again)
  std::mutex start_mu_;                          // one start at a time
  std::map<std::int64_t, InFlight*> in_flight_;  // by the call's request id
  std::map<std::string, InFlight*> by_token_;    // by its progress token
  std::int64_t next_token_ = 1;
  // The background thread: ticks, and pings after a timeout.
  std::condition_variable wake_;
  std::vector<std::shared_ptr<RpcChild>> to_probe_;
  std::thread background_;
};

/// One tool of a hosted server.
class HostedServerToolRunner final : public Runner {
 public:
  /// `enforcement_json`: {guarantee: what enforces it} of the child's walls ("" for none).
  HostedServerToolRunner(std::shared_ptr<HostedServer> server, std::string tool, std::string enforcement_json = {});
  RunOutcome run(const RunSpec& spec) override { return server_->call(spec, tool_); }
  void close() override { server_->close(); }
  std::string_view kind() const override { return server_->kind(); }
  std::vector<std::string> enforced_guarantees() const override { return enforced_; }
  const std::shared_ptr<HostedServer>& server() const { return server_; }
  const std::string& tool() const { return tool_; }

 private:
  std::shared_ptr<HostedServer> server_;
  std::string tool_;
  std::vector<std::string> enforced_;
};

/// The aid a remote tool is registered under: `prefix` + its name in capitals, every
/// character but letters and digits turned into '_', + ".v1" (AID.MCP.FILES.READ_FILE.v1).
std::string remote_aid(const std::string& prefix, const std::string& tool);
/// The default prefix: AID.SKILL.<NAME>. or AID.MCP.<NAME>.
std::string default_aid_prefix(const std::string& kind, const std::string& name);

}  // namespace machina
