// The host side of process isolation: a pool of supervised worker processes that run
// tool calls. A worker that crashes, exits or overruns its deadline is killed with its
// whole process group and replaced; only the call it was running fails. All state that
// must survive (ds_state, idempotency, leases, breakers) stays in the host.
#pragma once

#include <machina/call_context.hpp>
#include <machina/os_limits.hpp>

#include <atomic>
#include <sys/types.h>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace machina {

struct WorkerPoolOptions {
  std::string executable;            // machina-toolhost, started as `EXE --isolation-worker ...`
  std::size_t size = 1;              // most workers at once
  WorkerLimits limits;
  std::int64_t start_timeout_ms = 10'000;
  std::size_t stderr_tail_bytes = 2048;  // how much of a crashed worker's stderr is reported
  std::size_t max_output_bytes = 0;
  std::size_t max_request_bytes = 0;
};

class WorkerPool {
 public:
  enum class Ending { ran, timed_out, crashed, closed };
  struct Outcome {
    Ending ending = Ending::ran;
    int rc = 0;          // the tool's result code when it ran
    std::string detail;  // why it crashed: how the worker ended and its last stderr
  };
  struct Stats {
    std::uint64_t started = 0;   // workers started
    std::uint64_t crashed = 0;   // workers lost to a crash or exit during a call
    std::uint64_t timed_out = 0; // workers killed at a deadline
    std::size_t live = 0;        // workers now running
  };

  /// `plugins`: what each worker loads; `aids`: the tools the host expects it to have.
  WorkerPool(WorkerPoolOptions options, std::vector<std::string> plugins, std::vector<std::string> aids);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  /// Runs one call in a worker, filling `call` (output, error, slot changes) from what the
  /// worker reports. `state`: the ds_state the tool may read (null: empty).
  Outcome run(std::string_view aid, std::string_view input_json, const Slots* state, std::int64_t deadline_ms,
              CallContext& call);

  Stats stats() const;

  /// Ends every worker now (a call running in one fails with `tool_crashed`); later calls
  /// fail at once. For a host being closed while calls may still be running.
  void shutdown();

 private:
  struct Worker;
  struct SpawnRequest;

  std::unique_ptr<Worker> acquire(std::int64_t deadline_ms, std::string& why, bool& timed_out);
  void release(std::unique_ptr<Worker> worker);
  void retire(pid_t pid);              // a lost worker's place becomes free
  std::string end_of(Worker& worker);  // kills its group, reaps it, says how it ended
  std::unique_ptr<Worker> start_worker(std::int64_t deadline_ms, std::string& why);
  void spawner_loop();

  WorkerPoolOptions options_;
  std::vector<std::string> plugins_;
  std::vector<std::string> aids_;
  std::size_t max_result_bytes_;

  mutable std::mutex mu_;
  std::condition_variable freed_;
  std::vector<std::unique_ptr<Worker>> idle_;
  std::size_t live_ = 0;  // idle + busy + starting
  std::vector<pid_t> busy_;  // workers running a call
  bool closing_ = false;
  Stats stats_;

  // Workers are started from one long-lived thread: a worker asks to be killed when the
  // thread that started it ends (PR_SET_PDEATHSIG), which must mean "when the host ends".
  std::mutex spawn_mu_;
  std::condition_variable spawn_cv_;
  std::deque<SpawnRequest*> spawn_queue_;
  bool stopping_ = false;
  std::thread spawner_;
};

/// "was killed by signal 11 (SIGSEGV: Segmentation fault)" / "exited with status 3".
std::string describe_wait_status(int status);

}  // namespace machina
