// One child process under supervision, for every runner that talks to a process: started
// in a process group of its own with an explicit environment and descriptors, its stdout
// and stderr read into a bounded tail (and passed on to ours), killed with its whole group,
// reaped, and its end described in words.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace machina {

struct ChildSpec {
  std::string executable;
  std::vector<std::string> argv;          // argv[0] included
  std::vector<std::string> env;           // the child's whole environment ("NAME=value")
  std::vector<std::pair<int, int>> fds;   // (descriptor here, descriptor in the child), above 2
  std::size_t tail_bytes = 2048;          // how much of its last output is kept
};

/// A thread that starts children. A child that asks to die with its parent
/// (PR_SET_PDEATHSIG) dies when the thread that started it ends: with a spawner that is
/// when its owner ends, not when some passing thread does.
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

class ChildProcess {
 public:
  /// Starts the child (on `spawner`'s thread if given, else on this one): stdin is
  /// /dev/null, stdout and stderr go to one pipe read by this object. Throws HostError.
  explicit ChildProcess(const ChildSpec& spec, Spawner* spawner = nullptr);
  /// Ends the child (see end()) if that has not been done.
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  /// Non-blocking read end of the child's stdout and stderr.
  int output_fd() const { return out_; }

  /// Reads what the child has written (without blocking), passes it on to this process's
  /// stderr and keeps its tail. False once the child's side is closed.
  bool read_output();
  void clear_tail() { tail_.clear(); }
  /// The last tail_bytes of output since clear_tail(), as valid UTF-8.
  std::string tail() const;

  /// Kills the child's process group and the child, reaps it, reads its last output for
  /// up to `drain_ms`, and says how it ended ("was killed by signal 9 (SIGKILL: Killed)",
  /// "exited with status 3"). Later calls return the same words.
  const std::string& end(int drain_ms = 200);
  bool ended() const { return pid_ < 0; }
  /// Whether the child has exited (a zombie not yet reaped by end() counts), without
  /// reaping it.
  bool exited() const;

 private:
  void keep(const char* data, std::size_t n);

  pid_t pid_ = -1;
  int out_ = -1;
  std::size_t tail_bytes_;
  std::string tail_;
  std::string how_;
};

/// "was killed by signal 11 (SIGSEGV: Segmentation fault)" / "exited with status 3".
std::string describe_wait_status(int status);

/// The environment a child gets when it should get almost nothing of ours: the variables
/// named in `pass` that are set here (and only those).
std::vector<std::string> pick_environment(const std::vector<std::string>& pass);

}  // namespace machina
