// See process_runner.hpp. One call at a time per worker; the calling thread does the I/O
// with the call's own process itself (non-blocking, poll with the call's deadline), passing
// on what the worker writes to stderr and keeping its tail for crash reports. The worker's
// control socket brings its greeting (the tools it registered), call processes (their
// pipes as SCM_RIGHTS) and news of their end.
#include <machina/errors.hpp>
#include <machina/clock.hpp>
#include <machina/json_text.hpp>
#include <machina/isolation/worker_protocol.hpp>
#include <machina/runners/process_runner.hpp>
#include <machina/tool.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <optional>

namespace machina {

namespace {

constexpr std::size_t kMaxSlotLabelBytes = 64 * 1024;  // an artifact's type or provenance
constexpr std::size_t kMaxHelloBytes = 64u << 20;
constexpr std::int64_t kEndWaitMs = 2'000;  // for a killed call process to be gone, or its end reported

void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

int poll_timeout(std::int64_t deadline_ms) {
  const std::int64_t left = deadline_ms - steady_now_ms();
  if (left <= 0) return 0;
  return static_cast<int>(std::min<std::int64_t>(left, 1'000'000));
}

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
int wait_status(const worker::Ended& e) {
  if (e.code == CLD_EXITED) return (e.status & 0xff) << 8;
  return (e.status & 0x7f) | (e.code == CLD_DUMPED ? 0x80 : 0);
}

}  // namespace

struct ProcessRunner::Worker {
  std::unique_ptr<ChildProcess> process;  // the launcher (its process group: the sandbox)
  int control = -1;
  std::string cbuf;                 // control bytes not yet handled
  std::deque<int> fds;              // descriptors that came with them
  std::deque<CallProcess> ready;
  bool greeted = false;
  std::vector<ToolInfo> tools;      // from its greeting
  CallProcess last;                 // the previous call's process (its pidfd): gone before the next call
  std::int32_t watching = 0;        // a call process whose end is awaited (a crash to describe)
  std::optional<worker::Ended> end_seen;
  std::string rbuf;                 // kept between calls, at its size: reading into it costs no clearing
  std::string wbuf;

  ~Worker() {
    close_fd(control);
    for (auto& r : ready) r.close_all();
    last.close_all();
    for (int fd : fds) ::close(fd);
  }
  pid_t pid() const { return process ? process->pid() : -1; }
};

namespace {

enum class Pump { more, lost, timed_out };

/// Handles the complete control frames in w.cbuf. False (with why) if the worker broke
/// the protocol.
/// `expected`: the aids the worker must register (sorted); null: any (a plugin described).
bool handle_control(ProcessRunner::Worker& w, const std::vector<std::string>* expected, std::string& why) {
  std::size_t at = 0;
  while (w.cbuf.size() - at >= worker::kFrameHeader) {
    std::uint32_t size = 0;
    worker::FrameType type{};
    worker::read_header(std::string_view(w.cbuf).substr(at), size, type);
    if (size > kMaxHelloBytes) {
      why = "sent an oversized control frame";
      return false;
    }
    if (w.cbuf.size() - at < worker::kFrameHeader + size) break;
    const std::string_view payload = std::string_view(w.cbuf).substr(at + worker::kFrameHeader, size);
    at += worker::kFrameHeader + size;
    if (type == worker::FrameType::hello && !w.greeted) {
      worker::Hello hello;
      if (!worker::decode_hello(payload, hello)) {
        why = "sent a malformed greeting";
        return false;
      }
      std::vector<std::string> aids;
      for (const auto& t : hello.tools) aids.push_back(t.aid);
      std::sort(aids.begin(), aids.end());
      if (expected != nullptr && aids != *expected) {
        why = "registered other tools than the host (plugins changed on disk?)";
        return false;
      }
      w.tools = std::move(hello.tools);
      w.greeted = true;
    } else if (type == worker::FrameType::ready && w.greeted) {
      worker::Ready ready;
      if (!worker::decode_ready(payload, ready) || w.fds.size() < worker::kReadyFds) {
        why = "sent a malformed control frame";
        return false;
      }
      CallProcess p;
      p.pid = ready.pid;
      for (int* fd : {&p.call, &p.call_keep, &p.result, &p.pidfd}) {
        *fd = w.fds.front();
        w.fds.pop_front();
      }
      set_nonblocking(p.call);
      set_nonblocking(p.result);
      w.ready.push_back(p);
    } else if (type == worker::FrameType::ended && w.greeted) {
      worker::Ended ended;
      if (!worker::decode_ended(payload, ended)) {
        why = "sent a malformed control frame";
        return false;
      }
      if (ended.pid == w.watching) w.end_seen = ended;
    } else {
      why = w.greeted ? "sent an unexpected control frame" : "sent something other than its greeting";
      return false;
    }
  }
  w.cbuf.erase(0, at);
  return true;
}

/// Waits until `deadline_ms` for the worker's control socket or output, and takes in what
/// came. `lost` (with why) when the worker is gone or broke the protocol.
Pump pump(ProcessRunner::Worker& w, const std::vector<std::string>* expected, std::int64_t deadline_ms,
          std::string& why) {
  pollfd fds[2] = {{w.control, POLLIN, 0}, {w.process->output_fd(), POLLIN, 0}};
  const int n = ::poll(fds, 2, poll_timeout(deadline_ms));
  if (n < 0) {
    if (errno == EINTR) return Pump::more;
    why = std::string("poll failed: ") + std::strerror(errno);
    return Pump::lost;
  }
  if (n == 0) return Pump::timed_out;
  if (fds[1].revents) w.process->read_output();
  if (!fds[0].revents) return Pump::more;
  char data[4096];
  alignas(cmsghdr) char control[CMSG_SPACE(64 * sizeof(int))];
  iovec iov{data, sizeof data};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  const ssize_t got = ::recvmsg(w.control, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  if (got < 0 && (errno == EAGAIN || errno == EINTR)) return Pump::more;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      w.fds.push_back(fd);
    }
  }
  if (got <= 0) {
    why = "ended";
    return Pump::lost;
  }
  if (msg.msg_flags & MSG_CTRUNC) {
    why = "sent more descriptors than expected";
    return Pump::lost;
  }
  w.cbuf.append(data, static_cast<std::size_t>(got));
  return handle_control(w, expected, why) ? Pump::more : Pump::lost;
}

/// Whether the worker has ended: its process exited (its sandbox follows it), or the
/// sandbox's end of the control socket is closed. Data still queued on the socket
/// (descriptors of ready call processes) is no sign of life.
bool ended_while_idle(const ProcessRunner::Worker& w) {
  if (w.process->exited()) return true;
  pollfd fd{w.control, POLLIN | POLLRDHUP, 0};
  return ::poll(&fd, 1, 0) == 1 && (fd.revents & (POLLHUP | POLLRDHUP | POLLERR)) != 0;
}

}  // namespace

ProcessRunner::ProcessRunner(ProcessRunnerOptions options) : options_(std::move(options)) {
  if (options_.executable.empty()) throw HostError("process isolation needs the machina-toolhost executable");
  if (access(options_.executable.c_str(), X_OK) != 0) {
    throw HostError("process isolation: cannot run " + options_.executable + ": " + std::strerror(errno));
  }
  if (options_.size == 0) options_.size = 1;
  if (options_.spares == 0) options_.spares = 1;
  std::vector<std::string> names(std::begin(kWorkerEnvironment), std::end(kWorkerEnvironment));
  for (const auto& name : options_.pass_env) {
    if (name.starts_with("MACHINA_LEASE_")) throw HostError("the lease variables are never passed to workers: " + name);
    if (name.empty() || name.find('=') != std::string::npos)
      throw HostError("not an environment variable name: '" + name + "'");
    names.push_back(name);
  }
  env_ = pick_environment(names);
  max_result_bytes_ = worker::kFrameHeader + 64 + options_.max_output_bytes + kMaxToolErrorBytes +
                      kDsSlots * (options_.max_output_bytes + 2 * kMaxSlotLabelBytes + 64);
}

ProcessRunner::~ProcessRunner() {
  std::lock_guard lock(mu_);
  idle_.clear();  // each ends its worker
}

std::vector<ToolInfo> ProcessRunner::describe(const std::string& plugin) {
  {
    std::lock_guard lock(mu_);
    if (started_) throw HostError("plugin " + plugin + ": cannot load a plugin after the isolated workers have started");
  }
  std::string why;
  auto w = start_worker({plugin}, steady_now_ms() + options_.start_timeout_ms, why);
  if (!w) {
    // The worker's own words when it said why (e.g. "plugin P: cannot load: ..."), as an
    // inline host would have said them: its line, whatever the process printed after it
    // on its way out (a sanitizer's report, say).
    constexpr std::string_view kSaid = "machina-toolhost worker: ";
    if (const auto at = why.rfind(kSaid); at != std::string::npos) {
      std::string said = why.substr(at + kSaid.size());
      said.resize(std::min(said.size(), said.find('\n')));
      if (!said.empty()) throw HostError(said.starts_with("plugin ") ? said : "plugin " + plugin + ": " + said);
    }
    throw HostError("plugin " + plugin + ": " + why);
  }
  std::vector<ToolInfo> tools = std::move(w->tools);
  std::lock_guard lock(mu_);
  plugins_.push_back(plugin);
  for (const auto& t : tools) aids_.push_back(t.aid);
  return tools;
}

void ProcessRunner::add_linked(const std::vector<ToolInfo>& tools) {
  std::lock_guard lock(mu_);
  if (started_) throw HostError("the built-in tools cannot be added after the isolated workers have started");
  plugins_.emplace_back();  // "" stands for the linked tools
  for (const auto& t : tools) aids_.push_back(t.aid);
}

void ProcessRunner::close() {
  std::vector<std::unique_ptr<Worker>> idle;
  {
    std::lock_guard lock(mu_);
    closing_ = true;
    idle.swap(idle_);
    live_ -= idle.size();
    for (pid_t pid : busy_) {
      // The call running in it ends with the sandbox: its caller sees the pipes close.
      ::kill(-pid, SIGKILL);
      ::kill(pid, SIGKILL);
    }
    freed_.notify_all();
  }
}

ProcessRunner::Stats ProcessRunner::stats() const {
  std::lock_guard lock(mu_);
  Stats s = stats_;
  s.live = live_;
  return s;
}

std::unique_ptr<ProcessRunner::Worker> ProcessRunner::start_worker(const std::vector<std::string>& plugins,
                                                                  std::int64_t deadline_ms, std::string& why) {
  int sv[2] = {-1, -1};
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    why = std::string("cannot create a socket pair: ") + std::strerror(errno);
    return nullptr;
  }
  auto w = std::make_unique<Worker>();
  w->control = sv[0];
  ChildSpec spec;
  spec.executable = options_.executable;
  spec.argv = {options_.executable, "--isolation-worker", "--parent-pid", std::to_string(getpid()),
               "--max-output-bytes", std::to_string(options_.max_output_bytes), "--max-request-bytes",
               std::to_string(options_.max_request_bytes), "--isolation-spares", std::to_string(options_.spares)};
  for (const auto& p : plugins) {
    if (p.empty()) {
      spec.argv.push_back("--linked-tools");  // the host's own linked tools (it is this program too)
    } else {
      spec.argv.push_back("--plugin");
      spec.argv.push_back(p);
    }
  }
  const WorkerLimits& l = options_.limits;
  if (l.cpu_seconds) spec.argv.insert(spec.argv.end(), {"--limit-cpu-s", std::to_string(l.cpu_seconds)});
  if (l.address_space_mb) spec.argv.insert(spec.argv.end(), {"--limit-memory-mb", std::to_string(l.address_space_mb)});
  if (l.open_files) spec.argv.insert(spec.argv.end(), {"--limit-open-files", std::to_string(l.open_files)});
  if (l.file_size_mb) spec.argv.insert(spec.argv.end(), {"--limit-file-size-mb", std::to_string(l.file_size_mb)});
  if (l.no_network) spec.argv.push_back("--no-network");
  for (const auto& f : options_.hidden_files) spec.argv.insert(spec.argv.end(), {"--isolation-hide", f});
  spec.env = env_;
  spec.fds = {{sv[1], 3}};
  spec.tail_bytes = options_.stderr_tail_bytes;
  try {
    w->process = std::make_unique<ChildProcess>(spec, &spawner_);
  } catch (const HostError& e) {
    ::close(sv[1]);
    why = e.what();
    return nullptr;
  }
  ::close(sv[1]);

  // The worker's greeting: the tools it registered (for the pool's workers: the host's).
  const std::int64_t start_deadline = std::min(deadline_ms, steady_now_ms() + options_.start_timeout_ms);
  std::string fail;
  const std::vector<std::string>* expected = &plugins == &plugins_ ? &aids_ : nullptr;
  while (!w->greeted) {
    const Pump p = pump(*w, expected, start_deadline, fail);
    if (p == Pump::timed_out) fail = "did not start within " + std::to_string(options_.start_timeout_ms) + " ms";
    if (p == Pump::lost && fail == "ended") fail = "ended before it was ready";
    if (p != Pump::more) break;
  }
  if (w->greeted) return w;
  why = "worker process " + fail + "; it " + w->process->end();
  if (const std::string tail = w->process->tail(); !tail.empty()) why += "; its last stderr: " + tail;
  return nullptr;
}

std::unique_ptr<ProcessRunner::Worker> ProcessRunner::acquire(std::int64_t deadline_ms, std::string& why, bool& timed_out) {
  timed_out = false;
  {
    std::unique_lock lock(mu_);
    const auto until = std::chrono::steady_clock::time_point(std::chrono::milliseconds(deadline_ms));
    while (!closing_ && idle_.empty() && live_ >= options_.size) {
      if (freed_.wait_until(lock, until) == std::cv_status::timeout && idle_.empty() && live_ >= options_.size) {
        timed_out = true;
        why = "no worker became free before the deadline";
        return nullptr;
      }
    }
    if (closing_) {
      why = "the host is closed";
      return nullptr;
    }
    if (!idle_.empty()) {
      auto w = std::move(idle_.back());
      idle_.pop_back();
      busy_.push_back(w->pid());
      return w;
    }
    ++live_;
    if (!started_) {  // the lists of plugins and tools are fixed from now on
      started_ = true;
      std::sort(aids_.begin(), aids_.end());
    }
  }
  auto w = start_worker(plugins_, deadline_ms, why);
  std::lock_guard lock(mu_);
  if (w) ++stats_.started;
  if (!w) {
    --live_;
    freed_.notify_one();
  } else if (closing_) {
    why = "the host is closed";
    --live_;
    return nullptr;
  } else {
    busy_.push_back(w->pid());
  }
  return w;
}

void ProcessRunner::release(std::unique_ptr<Worker> worker) {
  std::lock_guard lock(mu_);
  std::erase(busy_, worker->pid());
  if (closing_) {
    --live_;
    return;
  }
  idle_.push_back(std::move(worker));
  freed_.notify_one();
}

void ProcessRunner::retire(std::unique_ptr<Worker> worker) {
  if (worker->process) worker->process->end();
  std::lock_guard lock(mu_);
  std::erase(busy_, worker->pid());
  --live_;
  freed_.notify_one();
}

RunOutcome ProcessRunner::run(const RunSpec& spec) {
  using Ending = RunOutcome::Ending;
  const std::int64_t deadline_ms = spec.deadline_ms;
  CallContext& call = spec.call;
  RunOutcome out;
  std::string why;
  bool queue_timeout = false;
  std::unique_ptr<Worker> w = acquire(deadline_ms, why, queue_timeout);
  // A worker that ended while idle (killed from outside, say) costs no call: nothing was
  // sent to it yet, so the call goes to a fresh one. The call processes it had made ready
  // die with it (they are its children, with PDEATHSIG).
  for (std::size_t tries = 0; w && tries <= options_.size && ended_while_idle(*w); ++tries) {
    {
      std::lock_guard lock(mu_);
      ++stats_.lost_idle;
    }
    retire(std::move(w));
    w = acquire(deadline_ms, why, queue_timeout);
  }
  auto closing = [&] {
    std::lock_guard lock(mu_);
    return closing_;
  };
  if (!w) {
    out.ending = queue_timeout ? Ending::timed_out : closing() ? Ending::closed : Ending::crashed;
    out.detail = why;
    return out;
  }
  // The worker is lost: every call process it made goes with it.
  auto lose = [&](const std::string& fail) {
    const std::string how = w->process->end();
    const std::string tail = w->process->tail();
    out.ending = closing() ? Ending::closed : Ending::crashed;
    out.detail = (fail.empty() || fail == "ended" ? std::string() : fail + "; ") + "the worker process " + how;
    if (!tail.empty()) out.detail += "; its last stderr: " + tail;
    retire(std::move(w));
    return out;
  };

  // Nothing of the previous call may still run when this one starts: its process was
  // killed when its answer came (or its deadline passed), and its end is the end of
  // everything it started (the kernel ends a PID namespace with its init).
  if (w->last.pidfd >= 0) {
    pollfd gone{w->last.pidfd, POLLIN, 0};
    if (::poll(&gone, 1, static_cast<int>(kEndWaitMs)) != 1) return lose("the previous call's process did not end");
    w->last.close_all();
  }
  w->process->clear_tail();  // a crash report shows what this call wrote
  while (w->ready.empty()) {
    const Pump p = pump(*w, &aids_, deadline_ms, why);
    if (p == Pump::lost) return lose(why);
    if (p == Pump::timed_out) {
      out.ending = Ending::timed_out;
      out.detail = "no call process was ready before the deadline";
      release(std::move(w));
      return out;
    }
  }
  CallProcess p = w->ready.front();
  w->ready.pop_front();
  {
    std::lock_guard lock(mu_);
    ++stats_.calls;
  }

  std::string& frame = w->wbuf;
  frame.clear();
  const Slots& state = call.state();
  bool any_state = false;
  for (const auto& slot : state) any_state = any_state || slot.has_value();
  worker::encode_call(spec.tool.info.aid, spec.input_json, any_state ? &state : nullptr, frame);
  // Most frames fit the pipe: write at once, poll only for what is left.
  std::size_t sent = 0;
  if (const ssize_t put = ::write(p.call, frame.data(), frame.size()); put > 0) sent = static_cast<std::size_t>(put);
  // A caller that may cancel wakes the wait below through an eventfd.
  int cancel_fd = -1;
  if (spec.cancel != nullptr) {
    cancel_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (cancel_fd >= 0) {
      spec.cancel->on_cancel([cancel_fd] {
        const std::uint64_t one = 1;
        (void)!::write(cancel_fd, &one, sizeof one);
      });
    }
  }
  struct CancelWake {
    CancelToken* token;
    int fd;
    ~CancelWake() {
      if (fd < 0) return;
      token->on_cancel(nullptr);
      ::close(fd);
    }
  } cancel_wake{spec.cancel, cancel_fd};
  bool cancelled = false;
  std::string& buf = w->rbuf;
  std::size_t have = 0;    // bytes of the reply in buf
  std::uint32_t want = 0;  // payload size once the header is in
  worker::FrameType type{};
  bool have_header = false;
  bool timed_out = false, eof = false;
  std::string fail;  // a reply that cannot be trusted

  for (;;) {
    if (!have_header && have >= worker::kFrameHeader) {
      worker::read_header(std::string_view(buf.data(), have), want, type);
      if ((type != worker::FrameType::result && type != worker::FrameType::died) || want > max_result_bytes_) {
        fail = "the worker sent a malformed reply";
        break;
      }
      have_header = true;
    }
    if (have_header && have >= worker::kFrameHeader + want) break;

    pollfd fds[4] = {{p.result, POLLIN, 0},
                     {w->process->output_fd(), POLLIN, 0},
                     {sent < frame.size() ? p.call : -1, POLLOUT, 0},
                     {cancel_fd, POLLIN, 0}};
    const int n = ::poll(fds, 4, poll_timeout(deadline_ms));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail = std::string("poll failed: ") + std::strerror(errno);
      break;
    }
    if (n == 0) {
      timed_out = true;
      break;
    }
    if (fds[3].revents & POLLIN) {
      cancelled = true;
      break;
    }
    if (fds[1].revents) w->process->read_output();
    if ((fds[2].revents & (POLLOUT | POLLERR)) && sent < frame.size()) {
      const ssize_t put = ::write(p.call, frame.data() + sent, frame.size() - sent);
      if (put > 0) sent += static_cast<std::size_t>(put);
      else if (put < 0 && errno != EAGAIN && errno != EINTR) sent = frame.size();  // it stopped reading: see below
    }
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      // Up to the end of the frame once its size is known (at most 1 MiB more at a time).
      const std::size_t end = std::min<std::size_t>(have_header ? worker::kFrameHeader + want : have + 64 * 1024,
                                                    have + (1u << 20));
      if (buf.size() < end) buf.resize(end);
      const ssize_t got = ::read(p.result, buf.data() + have, end - have);
      if (got > 0) have += static_cast<std::size_t>(got);
      if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
        eof = true;
        break;
      }
    }
  }
  // The call is over, whatever the process does next (it may have answered early and run
  // on): it is killed, and the next call waits until it is gone.
  p.kill();
  p.close_pipes();
  w->last = p;

  if (timed_out || cancelled) {
    if (timed_out) {
      std::lock_guard lock(mu_);
      ++stats_.timed_out;
    }
    release(std::move(w));
    out.ending = timed_out ? Ending::timed_out : Ending::cancelled;
    out.detail = cancelled ? "its process was killed" : "";
    return out;
  }
  worker::Result result;
  std::int32_t died = 0;
  if (fail.empty() && !eof) {
    const std::string_view payload = std::string_view(buf).substr(worker::kFrameHeader, want);
    if (type == worker::FrameType::died) {
      if (!worker::decode_died(payload, died) || died <= 0 || died > 64) fail = "the worker sent a malformed reply";
    } else if (!worker::decode_result(payload, result)) {
      fail = "the worker sent a malformed reply";
    }
  }
  if (!fail.empty() || eof || died != 0) {
    // How the call's process ended: what it said itself, else what its worker saw.
    std::string how;
    if (died != 0) {
      how = describe_wait_status(died);
    } else {
      w->watching = p.pid;
      w->end_seen.reset();
      const std::int64_t until = steady_now_ms() + kEndWaitMs;
      while (!w->end_seen) {
        const Pump got = pump(*w, &aids_, until, why);
        if (got == Pump::lost) return lose(fail);
        if (got == Pump::timed_out) break;
      }
      w->watching = 0;
      how = w->end_seen ? describe_wait_status(wait_status(*w->end_seen)) : "did not say how it ended";
    }
    {
      std::lock_guard lock(mu_);
      ++stats_.crashed;
    }
    out.ending = Ending::crashed;
    out.detail = (fail.empty() ? std::string() : fail + "; ") + "the worker process " + how;
    if (const std::string tail = w->process->tail(); !tail.empty()) out.detail += "; its last stderr: " + tail;
    release(std::move(w));
    return out;
  }
  if (buf.capacity() > (1u << 20)) buf = std::string();  // large buffers are not kept
  if (frame.capacity() > (1u << 20)) frame = std::string();
  release(std::move(w));

  // What comes back was produced next to tool code: check it as the inline host checks
  // what a tool hands over.
  out.rc = result.rc;
  call.output_overflow = result.output_overflow || result.output.size() > call.max_output;
  call.output_set = result.output_set && !call.output_overflow;
  if (call.output_set) call.output = std::move(result.output);
  call.error = to_valid_utf8(std::string_view(result.error).substr(0, kMaxToolErrorBytes));
  if (result.changes.set != 0 || result.changes.removed != 0) {
    for (std::size_t i = 0; i < kDsSlots; ++i) {
      if (!(result.changes.set & (1u << i))) continue;
      const Artifact& a = *result.changes.slots[i];
      if (a.content_json.size() > call.max_output || a.type.size() > kMaxSlotLabelBytes ||
          a.provenance.size() > kMaxSlotLabelBytes || !is_valid_utf8(a.type) || !is_valid_utf8(a.provenance) ||
          !validate_json(a.content_json)) {
        out.rc = MACHINA_TOOL_FAULT;
        call.error = "the worker reported an invalid ds_state slot";
        return out;
      }
    }
    call.writes() = std::move(result.changes);
  }
  return out;
}

}  // namespace machina
