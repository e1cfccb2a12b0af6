// One child process under supervision, for everything that runs a process: the isolation
// runner's workers, the Python pool's --serve hosts, the spawn transport's --run hosts and
// every later runner. The child starts in a process group of its own with an explicit
// environment and descriptors; what it writes to stderr is kept as a bounded tail; it is
// killed with its whole group, reaped, and its end is described in words.
#pragma once

#include <machina/errors.hpp>

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace machina {

struct ChildSpec {
  /// How the child's standard streams are connected.
  enum class Stdio {
    /// stdin is /dev/null; stdout and stderr are one pipe, read into the tail
    /// (output_fd()) and passed on to this process's stderr.
    shared_output,
    /// stdin and stdout are pipes of their own for the caller (input_fd(), stdout_fd());
    /// stderr is a third, read into the tail (output_fd()) and not passed on.
    pipes,
  };
  std::string executable;
  std::vector<std::string> argv;         // argv[0] included
  std::vector<std::string> env;          // the child's whole environment ("NAME=value")
  bool inherit_env = false;              // ignore `env`: the child gets this process's environment
  std::vector<std::pair<int, int>> fds;  // (descriptor here, descriptor in the child), above 2
  std::size_t tail_bytes = 2048;         // how much of its last output is kept
  Stdio stdio = Stdio::shared_output;
  std::string cwd;  // its working directory ("": this process's)
};

/// The child could not be started; `error` is the errno of the failure.
class StartError : public ConfigError {
 public:
  StartError(const std::string& what, int errno_value) : ConfigError(what), error(errno_value) {}
  int error;
};

/// A thread that starts children (from the first child on). A child that asks to die with
/// its parent (PR_SET_PDEATHSIG) dies when the thread that started it ends: with a spawner
/// that is when its owner ends, not when some passing thread does.
class Spawner {
 public:
  Spawner();
  ~Spawner();
  Spawner(const Spawner&) = delete;
  Spawner& operator=(const Spawner&) = delete;

  struct Job;
  /// Runs `job` on the spawner's thread and waits for it.
  void run(Job& job);

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job*> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

/// Thread-safe except for read_output() and clear_tail(), which one thread at a time may
/// call while nothing drains in the background.
class ChildProcess {
 public:
  /// Starts the child (on `spawner`'s thread if given, else on this one). Throws
  /// StartError when it cannot be started, ConfigError when this process is out of
  /// descriptors.
  explicit ChildProcess(const ChildSpec& spec, Spawner* spawner = nullptr);
  /// Ends the child (see end()) if that has not been done; closes every descriptor.
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  /// The child's pid (also its process group's id); stays the same after end().
  pid_t pid() const { return pid_; }
  /// Non-blocking read end of what goes into the tail (stdout and stderr, or stderr alone).
  int output_fd() const { return out_; }
  /// With Stdio::pipes: the write end of the child's stdin and the read end of its
  /// stdout, both non-blocking. They stay open (and their numbers taken) until this object
  /// goes, so that another thread about to use them meets EPIPE/EOF, never another file.
  int input_fd() const { return in_; }
  int stdout_fd() const { return stdout_; }
  /// End of input for the child: its stdin pipe is closed (the number stays taken, now
  /// reading /dev/null). Whoever writes to input_fd() must not be writing meanwhile.
  void close_input();

  /// Reads what the child has written to output_fd() (without blocking) into the tail.
  /// False once the child's side is closed.
  bool read_output();
  /// Reads output_fd() on a thread of this object's until the child's side is closed or
  /// end() stops it, so that a child is never blocked on a full stderr pipe.
  void drain_in_background();
  void clear_tail();
  /// The last tail_bytes of output since clear_tail(), as valid UTF-8.
  std::string tail() const;

  /// Whether the child has exited (a zombie not yet reaped by end() counts), without
  /// reaping it.
  bool exited() const;
  /// Waits up to `limit` for the child to exit, without reaping it; whether it has.
  bool wait_exit(std::chrono::milliseconds limit) const;
  /// SIGKILL to the child's process group and the child (nothing once it is reaped).
  void kill();

  /// Kills the child's process group and the child (while the child is still unreaped,
  /// so its group id cannot have been reused), reaps it, reads its last output for up to
  /// `drain_ms` (until the pipe closes), and says how it ended ("was killed by signal 9
  /// (SIGKILL: Killed)", "exited with status 3"). Later calls return the same words.
  const std::string& end(int drain_ms = 200);
  bool ended() const { return reaped_.load(std::memory_order_acquire); }
  /// After end(): the exit code in Python's form (-N for signal N).
  int exit_code() const;

 private:
  void keep(const char* data, std::size_t n);
  void drain_loop();
  void stop_draining(int drain_ms);

  pid_t pid_ = -1;
  int out_ = -1;
  int in_ = -1;
  int stdout_ = -1;
  int pidfd_ = -1;
  bool echo_ = true;
  std::size_t tail_bytes_;
  mutable std::mutex tail_mu_;
  std::string tail_;
  std::thread drainer_;
  int wake_[2] = {-1, -1};              // stops the drainer
  std::condition_variable drained_cv_;  // with tail_mu_: the drainer saw the pipe close
  bool drained_ = false;
  std::mutex end_mu_;   // one end() at a time
  std::mutex reap_mu_;  // kill() never signals a reaped (reusable) pid
  std::atomic<bool> reaped_{false};
  int status_ = 0;
  std::string how_;
};

/// What run_to_completion saw.
struct ChildOutcome {
  enum class Ended { exited, timed_out, output_over_cap };
  Ended ended = Ended::exited;
  std::string stdout_text;  // everything it wrote (up to the cap)
  int exit_code = 0;        // as ChildProcess::exit_code()
  std::string how;          // as ChildProcess::end()
  std::string tail;         // the tail of its stderr
};

/// Runs a child to completion (Stdio::pipes forced): writes `input` to its stdin and
/// closes it, reads its stdout (at most `max_stdout` bytes: past that it is killed) and the
/// tail of its stderr, until its stdout closes and it has exited. Past `limit` its whole
/// group is killed. Every path reaps it, after killing what is left of its group (what a
/// stuck grandchild may still hold open). Throws as ChildProcess's constructor.
ChildOutcome run_to_completion(ChildSpec spec, std::string_view input, std::chrono::milliseconds limit,
                               std::size_t max_stdout);

/// write(2) that never raises SIGPIPE in this process (the caller sees EPIPE instead),
/// whatever this process does with the signal: for writing to a child's stdin.
ssize_t write_quietly(int fd, const char* data, std::size_t n);

/// "was killed by signal 11 (SIGSEGV: Segmentation fault)" / "exited with status 3".
std::string describe_wait_status(int status);
/// The exit code in Python's form: the status, or -N for signal N.
int exit_code_of(int status);

/// The environment a child gets when it should get almost nothing of ours: the variables
/// named in `pass` that are set here (and only those).
std::vector<std::string> pick_environment(const std::vector<std::string>& pass);

}  // namespace machina
