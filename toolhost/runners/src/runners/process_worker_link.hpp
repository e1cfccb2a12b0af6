// The host's side of an isolation worker's link (process_runner.hpp): a worker as the
// runner holds it (its launcher, control socket, ready call processes), one call process,
// and the reading of the control socket (frames, passed descriptors, news of an end).
#pragma once

#include <machina/child_process.hpp>
#include <machina/fd_io.hpp>
#include <machina/isolation/worker_protocol.hpp>
#include <machina/runners/process_runner.hpp>

#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

namespace machina {
namespace worker_link {

/// Milliseconds left until `deadline_ms` as a poll(2) timeout (0 when past).
int poll_timeout(std::int64_t deadline_ms);

/// One call process, ready or running: its pipes and its pidfd.
struct CallProcess {
  std::int32_t pid = 0;  // in the worker's PID namespace (names it in `ended` frames)
  int call = -1;         // write end of its call pipe
  int call_keep = -1;    // read end, held so that a dead process never raises SIGPIPE here
  int result = -1;       // read end of its result pipe
  int pidfd = -1;

  void close_pipes() {
    close_fd(call);
    close_fd(call_keep);
    close_fd(result);
  }
  void close_all() {
    close_pipes();
    close_fd(pidfd);
  }
  // (sys/pidfd.h of glibc 2.36 declares pidfd_send_signal without C linkage)
  void kill() const { ::syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0); }
};

/// A wait status from what waitid(2) reported.
int wait_status(const worker::Ended& e);

}  // namespace worker_link

struct ProcessRunner::Worker {
  std::unique_ptr<ChildProcess> process;  // the launcher (its process group: the sandbox)
  int control = -1;
  std::string cbuf;     // control bytes not yet handled
  std::deque<int> fds;  // descriptors that came with them
  std::deque<worker_link::CallProcess> ready;
  bool greeted = false;
  std::vector<ToolInfo> tools;    // from its greeting
  worker_link::CallProcess last;  // the previous call's process (its pidfd): gone before the next call
  std::int32_t watching = 0;      // a call process whose end is awaited (a crash to describe)
  std::optional<worker::Ended> end_seen;
  std::string rbuf;  // kept between calls, at its size: reading into it costs no clearing
  std::string wbuf;

  ~Worker() {
    close_fd(control);
    for (auto& r : ready) r.close_all();
    last.close_all();
    for (int fd : fds) ::close(fd);
  }
  pid_t pid() const { return process ? process->pid() : -1; }
};

namespace worker_link {

/// What pump() found: more to wait for; the sandbox ended (its end of the control socket
/// closed); the worker lost otherwise (why says how); the deadline passed.
enum class Pump { more, ended, lost, timed_out };

/// Handles the complete control frames in w.cbuf. False (with why) if the worker broke
/// the protocol. `expected`: the aids the worker must register (sorted); null: any (a
/// plugin described).
bool handle_control(ProcessRunner::Worker& w, const std::vector<std::string>* expected, std::string& why);
/// Waits until `deadline_ms` for the worker's control socket or output, and takes in what
/// came. `ended` when the sandbox has ended; `lost` (with why) when the socket failed or the
/// worker broke the protocol.
Pump pump(ProcessRunner::Worker& w, const std::vector<std::string>* expected, std::int64_t deadline_ms,
          std::string& why);
/// Whether the worker has ended: its process exited (its sandbox follows it), or the
/// sandbox's end of the control socket is closed. Data still queued on the socket
/// (descriptors of ready call processes) is no sign of life.
bool ended_while_idle(const ProcessRunner::Worker& w);
/// Ends the worker's process and says how it ended. When the sandbox has ended on its own
/// (`sandbox_ended`: pump() said `ended`), the launcher first has a moment to exit: it ends
/// the way the sandbox did (the signal that killed it, say), which tells more than the kill
/// that ends it otherwise.
std::string end_worker(ProcessRunner::Worker& w, bool sandbox_ended);

}  // namespace worker_link
}  // namespace machina
