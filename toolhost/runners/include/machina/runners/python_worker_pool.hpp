// The warm Python workers of the Python runner (python_runner.hpp) and of execute_python:
// worker interpreters (python -c <machina_dispatch.tool_worker> --serve). A pool of
// workers serves every tool of one interpreter and one set of import roots, sandbox and
// limits; modules are imported once per worker. Each worker runs its calls one after the
// other, and may have a few more queued behind the one it runs (so that it reads its next
// request without sleeping); a queued call carries its deadline, and a worker skips a call
// whose deadline has passed before it started. A worker that crashes, breaks the protocol,
// overruns a deadline or grows past its memory cap is killed with its process group and
// replaced: the call it was running is answered `tool_crashed` or `timeout` with the tail of
// its stderr, and the calls queued behind it, which never started, go to another worker.
// A worker serves one caller (the request's `user`): once it has taken a call of one, a call
// of another goes to another worker, or to a new one in the place of an idle worker of
// someone else. A worker found with threads left running once it has answered every call
// sent to it (its interpreter's thread count, read by the host: threads started around the
// interpreter count too) is retired and replaced before it takes another call.
#pragma once

#include <machina/child_process.hpp>
#include <machina/runner.hpp>  // CancelToken, EventSink

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace machina {

struct PythonPoolOptions {
  std::string python;                    // the interpreter, an absolute path
  std::vector<std::string> roots;        // modules are imported from these first; the first is the working directory
  std::string cwd;                       // the working directory instead of the first root ("": the first root)
  std::vector<std::string> worker_args;  // more arguments for the worker (tool_worker.py's --module ...)
  std::vector<std::string> env;          // the workers' whole environment
  /// Argument vector that starts the interpreter inside its sandbox (the interpreter's own
  /// arguments follow it); empty: the interpreter is started directly.
  std::vector<std::string> launcher;
  std::size_t workers = 1;      // most workers at once
  std::size_t queue_depth = 8;  // most calls sent to one worker and not yet answered
  std::uint64_t memory_mb = 0;  // a worker resident past this is killed and replaced; 0: no cap
  std::size_t stderr_tail_bytes = 2048;
  std::size_t max_answer_bytes = 0;  // longest answer line read (the output cap and room for the trace)
  /// How long a caller polls for its answer before sleeping (never on one CPU).
  std::chrono::microseconds spin{50};
  /// A worker retired after its call is replaced at once (off the callers' threads), the
  /// pool filled up to `workers`, so that the next call finds one started.
  bool replace_retired = false;
  EventSink on_event;
};

/// The workers of one interpreter and one set of roots, sandbox and limits.
class PythonWorkerPool {
 public:
  /// How a call sent through the pool ended.
  struct Exchange {
    enum class Ending { answered, timed_out, crashed, closed, cancelled };
    Ending ending = Ending::answered;
    std::string answer;     // the answer line (answered)
    std::string detail;     // what happened (otherwise)
    pid_t pid = 0;          // the worker that had it
    bool killed = false;    // timed_out, cancelled: it had started, and its worker was killed for it
    bool over_run = false;  // timed_out: at the end of its running time (run_ms), before the deadline
    bool retired = false;   // answered: its worker was retired after it (it takes no other call)
  };
  struct Stats {
    std::uint64_t started = 0;   // workers started
    std::uint64_t replaced = 0;  // workers that ended other than by close()
    std::uint64_t requeued = 0;  // calls sent again because their worker ended before they started
    std::size_t live = 0;
  };

  explicit PythonWorkerPool(PythonPoolOptions options);
  ~PythonWorkerPool();
  PythonWorkerPool(const PythonWorkerPool&) = delete;
  PythonWorkerPool& operator=(const PythonWorkerPool&) = delete;

  /// Whether the worker that gave this answer must take no other call (it is then killed
  /// and replaced as soon as its answer is read, before another call can reach it).
  using Retire = std::function<bool(std::string_view answer)>;

  /// Sends one request line (with its '\n') to a worker and waits for its answer until
  /// `deadline_ms` (steady_now_ms), and at most `run_ms` (if not 0) from when the line is sent
  /// to its worker (with queue_depth 1: from when it starts). `caller`: who calls (a worker
  /// serves one caller only). Thread-safe.
  Exchange call(std::string_view line, std::int64_t deadline_ms, CancelToken* cancel = nullptr,
                const Retire* retire = nullptr, std::int64_t run_ms = 0, std::string_view caller = {});
  /// Kills the worker `pid` (it broke the protocol): replaced, its queued calls sent again.
  void condemn(pid_t pid, const std::string& why);
  /// Ends every worker; later calls end `closed`. Idempotent.
  void close();

  const PythonPoolOptions& options() const { return options_; }
  Stats stats() const;

  /// The interpreter's environment (`sys.prefix`): what its workers reported, else what its
  /// path gives without starting it (the folder above `bin/`: a virtual environment, or the
  /// prefix a Python is installed under).
  std::string python_env() const;
  /// Records the environment a worker reported; the first report stands (an interpreter's
  /// environment never changes). Thread-safe; once one is recorded, an atomic load.
  void reported_python_env(std::string_view env);

 private:
  struct Pending;
  struct Worker;
  enum class Sent { queued, closed, busy, cannot_start };

  Sent send(const std::shared_ptr<Pending>& call, std::string_view line, std::shared_ptr<Worker>& worker,
            std::string& why);
  std::shared_ptr<Worker> start();
  /// Reads the worker's answers (settling the calls they answer) until `call` is settled,
  /// its deadline passes, or the worker ends. With mu_ held (released while reading).
  void read_for(Worker& worker, Pending& call, std::unique_lock<std::mutex>& lock);
  /// Settles the calls the complete lines in the worker's buffer answer. With mu_ held.
  void take_answers(Worker& worker);
  /// The worker's interpreter's pid (below a sandbox's launcher and init); 0 while not found.
  pid_t interpreter_of(Worker& worker) const;
  /// Resident memory of the worker's interpreter in MiB (0 while it cannot be read).
  std::uint64_t interpreter_mb(Worker& worker) const;
  /// Threads of the worker's interpreter, as the kernel counts them (0 while it cannot be read).
  std::size_t interpreter_threads(Worker& worker) const;
  /// The worker is gone (ended, or killed for `why`): fails the call it was running and
  /// hands the others back to be sent again. With mu_ held.
  void lost(Worker& worker, const std::string& why);
  /// Takes the worker out of the pool, for the reaper. With mu_ held.
  void retire(Worker& worker);
  /// Kills the worker for `why` (out of the pool at once). With mu_ held.
  void kill(Worker& worker, std::string why);
  /// Stops a call at its caller's request: its worker killed if it runs, skipped if queued.
  void cancel_call(const std::shared_ptr<Pending>& call);
  void reap_loop();

  PythonPoolOptions options_;
  std::chrono::microseconds spin_;
  std::vector<std::string> argv_;
  Spawner spawner_;
  mutable std::mutex mu_;
  std::condition_variable changed_;               // a worker started, ended or has room
  std::vector<std::shared_ptr<Worker>> workers_;  // live (or starting)
  std::size_t starting_ = 0;
  bool refill_ = false;  // a worker was retired: the reaper fills the pool up (replace_retired)
  bool closing_ = false;
  Stats stats_;
  // Killed and ended workers are reaped here, off the callers' threads.
  std::condition_variable reap_cv_;
  std::vector<std::shared_ptr<Worker>> to_reap_;
  bool stop_reaper_ = false;
  std::thread reaper_;
  std::atomic<bool> env_known_{false};  // python_env_ is set (written once, with mu_ held)
  std::string python_env_;
};

}  // namespace machina
