// The process runner (--isolation process): native plugin tools run in a pool of
// sandboxed workers (see isolation/worker.hpp), each serving one call at a time, each call
// in a fresh process of its own that the host talks to directly over that process's own
// pipes. A call that crashes, exits or overruns its deadline costs that call only; the
// worker lives on. All state that must survive (ds_state, idempotency, leases, breakers)
// stays in the host, and no plugin code ever runs in the host's process: even the tools'
// descriptions come from a sandboxed worker (describe()).
#pragma once

#include <machina/child_process.hpp>
#include <machina/os_limits.hpp>
#include <machina/process_runner_options.hpp>
#include <machina/runner.hpp>
#include <machina/tool.hpp>

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace machina {

/// What a worker's environment is made of (those of these variables that are set in the
/// host), plus what the operator names (ProcessRunnerOptions::pass_env): nothing else of the
/// host's environment reaches tool code.
inline constexpr const char* kWorkerEnvironment[] = {"PATH",
                                                     "HOME",
                                                     "USER",
                                                     "LOGNAME",
                                                     "LANG",
                                                     "LC_ALL",
                                                     "LC_CTYPE",
                                                     "TZ",
                                                     "TMPDIR",
                                                     "LD_LIBRARY_PATH",
                                                     "MACHINA_TOOLHOST_WORKSPACE",
                                                     "ASAN_OPTIONS",
                                                     "UBSAN_OPTIONS",
                                                     "LSAN_OPTIONS"};

class ProcessRunner final : public Runner {
 public:
  struct Stats {
    std::uint64_t started = 0;    // workers (sandboxes) started
    std::uint64_t calls = 0;      // call processes used, one per call
    std::uint64_t crashed = 0;    // calls whose process crashed or exited
    std::uint64_t timed_out = 0;  // calls killed at their deadline
    std::uint64_t lost_idle = 0;  // workers found ended while idle, replaced before a call
    std::size_t live = 0;         // workers now running
  };
  struct Worker;  // one sandboxed worker, as the host sees it (process_worker_link.hpp)

  /// Throws ConfigError if the executable cannot be run or an option is wrong.
  explicit ProcessRunner(ProcessRunnerOptions options);
  ~ProcessRunner() override;
  ProcessRunner(const ProcessRunner&) = delete;
  ProcessRunner& operator=(const ProcessRunner&) = delete;

  /// Loads a plugin library in a sandboxed worker of its own and returns the tools it
  /// registers, as described there: the library's code never runs in this process. Its
  /// workers load it from then on. Throws ConfigError with the worker's own words if the
  /// plugin cannot be loaded, or if the workers have started.
  std::vector<ToolInfo> describe(const std::string& plugin);
  /// The tools linked into the worker executable itself (`--linked-tools`).
  void add_linked(const std::vector<ToolInfo>& tools);

  RunOutcome run(const RunSpec& spec) override;
  /// Ends every worker now (a call running in one fails); later calls fail at once. For a
  /// host being closed while calls may still be running.
  void close() override;
  std::string_view kind() const override { return "process"; }
  std::vector<std::string> enforced_guarantees() const override {
    if (options_.limits.no_network) return {"no_network"};
    return {};
  }

  Stats stats() const;

 private:
  std::unique_ptr<Worker> acquire(std::int64_t deadline_ms, std::string& why, bool& timed_out);
  void release(std::unique_ptr<Worker> worker);
  void retire(std::unique_ptr<Worker> worker);  // a lost worker's place becomes free
  /// Starts a worker loading `plugins`; it must register `expected` (sorted aids), when
  /// not null.
  std::unique_ptr<Worker> start_worker(const std::vector<std::string>& plugins,
                                       const std::vector<std::string>* expected, std::int64_t deadline_ms,
                                       std::string& why);

  ProcessRunnerOptions options_;
  std::size_t max_result_bytes_;
  std::vector<std::string> env_;  // the workers' whole environment
  Spawner spawner_;               // workers die with the host (PR_SET_PDEATHSIG on this thread)

  mutable std::mutex mu_;
  std::condition_variable freed_;
  std::vector<std::string> plugins_;  // what each worker loads ("": the linked tools)
  std::vector<std::string> aids_;     // sorted: what each worker must register
  bool started_ = false;              // workers have started: the lists above are fixed
  std::vector<std::unique_ptr<Worker>> idle_;
  std::size_t live_ = 0;     // idle + busy + starting
  std::vector<pid_t> busy_;  // workers running a call
  bool closing_ = false;
  Stats stats_;
};

}  // namespace machina
