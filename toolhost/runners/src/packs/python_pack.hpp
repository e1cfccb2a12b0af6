// execute_python, install_python_package and list_python_packages (docs/tool-packs.md#execute_python):
// Python code run by warm tool workers (runners/python_runner.hpp) inside the sandbox
// launcher's walls (no network, no socket, no new process, writing only its own folder,
// reading only the interpreter, its workspace's packages and its own folder, the lease key
// hidden, memory and file limits), per workspace: a scope of the policy (a user listed in
// [users], or the defaults) with a virtual environment that pip installs into, run by the
// host in walls of its own where the network is open. A call without a session runs in a
// folder of its own, in one of the workspace's interpreters that was started ahead of it and
// runs no other call (nothing a caller's code leaves in an interpreter reaches another
// call); a session (of one user) keeps its namespace in one worker reserved for it, until it
// is idle too long, its code is killed or leaves threads running, or a new session needs
// its place.
#pragma once

#include "packs.hpp"

#include <machina/python_sandbox.hpp>
#include <machina/runners/python_worker_pool.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace machina::packs {

class PythonPack {
 public:
  /// `executable`: machina-toolhost, the launcher of the walls ("" when not known: every
  /// call is then refused with SystemError).
  PythonPack(const Policy& policy, std::string executable);
  ~PythonPack();
  PythonPack(const PythonPack&) = delete;
  PythonPack& operator=(const PythonPack&) = delete;

  Result execute(const Call& c);
  Result install(const Call& c);
  Result list(const Call& c);

  /// Ends every worker and session and removes this host's folders; later calls end `closed`.
  void close();

  /// Live sessions (for tests and the benchmark's checks).
  std::size_t sessions() const;

  struct Workspace;
  struct ReplSession;

 private:
  /// The workspace of the caller's scope, made ready (its environment, this host's folder
  /// in it) on first use; null with a refusal.
  Workspace* workspace(const Call& c, Result& refusal);
  /// list() where code cannot be confined: the policy's interpreter's own packages, read by
  /// that interpreter isolated (-I -S: no site initialisation, so no installed code runs),
  /// without a workspace.
  Result list_without_workspace(const Call& c);
  /// A session of `user`'s by id (another user's of the same id is another session): the
  /// live one, or a new one (ending the idlest idle session past the cap); null with a
  /// refusal. Held (one call at a time) until release().
  std::shared_ptr<ReplSession> acquire(Workspace& ws, std::string_view user, const std::string& id,
                                       std::int64_t deadline_ms, bool& fresh, Result& refusal);
  void release(const std::shared_ptr<ReplSession>& s, bool keep);
  void end_session(const std::shared_ptr<ReplSession>& s);
  void reap_loop();
  /// A pool of warm workers for code that may write only beneath `writable`.
  std::shared_ptr<PythonWorkerPool> make_pool(const Workspace& ws, const std::string& writable,
                                              std::size_t workers) const;
  std::shared_ptr<PythonWorkerPool> stateless_pool(Workspace& ws);
  /// A new folder of its own for a call without a session; "" with `why`.
  static std::string take_folder(Workspace& ws, std::string& why);
  /// The call is done with its folder: removed (never used again). What is left beside the
  /// call folders (their parent is the interpreters' writable root) is removed too.
  static void give_back_folder(Workspace& ws, const std::string& dir);
  /// Installs `specs` one at a time; stops at the first failure (its text in `failure`).
  /// A refusal (a spec the policy does not allow) comes before anything runs.
  Result install_all(const Call& c, Workspace& ws, const std::vector<std::string>& specs, nlohmann::json& installed,
                     std::string& failure);
  /// Why the walls cannot be built here ("" when they can).
  std::string unconfinable() const;

  const Policy& policy_;
  std::string executable_;
  std::string host_id_;  // this host's folders in each workspace: run/<host_id_>
  std::mutex mu_;        // workspaces_, closed_
  std::map<std::string, std::unique_ptr<Workspace>> workspaces_;
  bool closed_ = false;
  mutable std::mutex sessions_mu_;
  std::condition_variable sessions_cv_;                           // for the reaper: a session was added, or closing
  std::map<std::string, std::shared_ptr<ReplSession>> sessions_;  // by workspace and id; at most max_sessions
  bool stop_reaper_ = false;
  std::thread reaper_;
};

/// One scope's workspace as this host uses it.
struct PythonPack::Workspace {
  std::string scope;        // the policy's scope ("" for the defaults)
  std::string dir;          // <workspaces>/<default | user-NAME-HASH>
  std::string env;          // <dir>/env: the virtual environment installs go into
  std::string python;       // <env>/bin/python: what the workers run
  std::string base_python;  // the policy's interpreter (pip is its)
  std::string pip_runner;   // pip's __pip-runner__.py (found at the first install, under install_mu)
  std::string run;          // <dir>/run/<host id>: this host's, removed when it closes
  std::string calls;        // <run>/calls: a folder per call without a session
  std::string sessions;     // <run>/sessions: a folder per session
  std::string pip_tmp;      // <run>/pip: pip's temporary files
  InterpreterFiles files;   // of <env>/bin/python
  int run_lock = -1;        // flock on <run>/lock, held while this host lives (others see it is not stale)
  std::mutex pool_mu;
  std::shared_ptr<PythonWorkerPool> pool;  // calls without a session (made on first use)
  std::timed_mutex install_mu;             // one install at a time in this host (<dir>/install.lock: in all)
  std::atomic<std::uint64_t> serial{0};    // names of call and session folders
  std::mutex folders_mu;
  std::set<std::string> folders;  // the names of the call folders in use
  ~Workspace();
};

/// An execute_python session (a REPL): one worker reserved for it, keeping the code's names
/// between its calls.
struct PythonPack::ReplSession {
  std::string key;  // workspace scope, user and id
  std::string id;
  std::string dir;  // <run>/sessions/<serial>-<id>: the code's own folder
  std::shared_ptr<PythonWorkerPool> pool;
  std::timed_mutex running;  // one call at a time
  // Guarded by sessions_mu_:
  std::size_t holders = 0;  // calls running or waiting to
  std::chrono::steady_clock::time_point last_used;
  bool ended = false;
};

/// What a worker's answer to the code runner carries: the code runner's object, or why
/// there is none.
bool decode_code_runner_answer(const PythonWorkerPool::Exchange& ex, nlohmann::json& out, std::string& why);

}  // namespace machina::packs
