// See worker_pool.hpp. One call at a time per worker; the calling thread does the I/O
// with the worker itself (non-blocking, poll with the call's deadline), forwarding what
// the worker writes to stderr and keeping its tail for crash reports.
#include <machina/errors.hpp>
#include <machina/host.hpp>
#include <machina/json_text.hpp>
#include <machina/worker_pool.hpp>
#include <machina/worker_protocol.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

extern char** environ;

namespace machina {

namespace {

constexpr std::size_t kMaxSlotLabelBytes = 64 * 1024;  // an artifact's type or provenance

void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

// The worker's ends of its pipes are moved to descriptors above those they become in the
// worker (1 to 4), so that no dup2 of the spawn overwrites another end (an embedding
// program with a closed stdin would otherwise be given low descriptors by pipe2).
void move_above_stdio(int& fd) {
  if (fd > 4) return;
  const int moved = fcntl(fd, F_DUPFD_CLOEXEC, 5);
  if (moved >= 0) {
    ::close(fd);
    fd = moved;
  }
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

int poll_timeout(std::int64_t deadline_ms) {
  const std::int64_t left = deadline_ms - steady_now_ms();
  if (left <= 0) return 0;
  return static_cast<int>(std::min<std::int64_t>(left, 1'000'000));
}

}  // namespace

std::string describe_wait_status(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* abbrev = sigabbrev_np(sig);
    const char* what = sigdescr_np(sig);
    std::string s = "was killed by signal " + std::to_string(sig);
    if (abbrev != nullptr) s += std::string(" (SIG") + abbrev + (what != nullptr ? std::string(": ") + what : "") + ")";
    return s;
  }
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  return "ended (wait status " + std::to_string(status) + ")";
}

// Calls and results travel over two pipes, not a socketpair: a pipe round trip costs
// about 60% of a stream socket's on this kind of machine. The host holds the read end
// of the call pipe as well (it never reads it), so writing a call to a worker that died
// never raises SIGPIPE in the host, whatever the embedding program does with that
// signal; the death shows as end-of-file on the result pipe instead.
struct WorkerPool::Worker {
  pid_t pid = -1;
  int to = -1;        // write end of the call pipe
  int to_keep = -1;   // its read end, held open (see above)
  int from = -1;      // read end of the result pipe
  int err = -1;       // read end of the worker's stdout+stderr
  std::string tail;   // the last stderr_tail_bytes it wrote
  std::string rbuf;   // kept between calls, at its size: reading into it costs no clearing
  std::string wbuf;

  ~Worker() {
    close_fd(to);
    close_fd(to_keep);
    close_fd(from);
    close_fd(err);
  }
};

struct WorkerPool::SpawnRequest {
  std::vector<std::string> argv;
  int call_fd = -1;    // becomes the worker's fd 3
  int result_fd = -1;  // becomes the worker's fd 4
  int err_fd = -1;
  pid_t pid = -1;
  int error = 0;
  bool done = false;
};

WorkerPool::WorkerPool(WorkerPoolOptions options, std::vector<std::string> plugins, std::vector<std::string> aids)
    : options_(std::move(options)), plugins_(std::move(plugins)), aids_(std::move(aids)) {
  if (options_.executable.empty()) throw HostError("process isolation needs the machina-toolhost executable");
  if (access(options_.executable.c_str(), X_OK) != 0) {
    throw HostError("process isolation: cannot run " + options_.executable + ": " + std::strerror(errno));
  }
  if (options_.size == 0) options_.size = 1;
  std::sort(aids_.begin(), aids_.end());
  max_result_bytes_ = worker::kFrameHeader + 64 + options_.max_output_bytes + kMaxToolErrorBytes +
                      kDsSlots * (options_.max_output_bytes + 2 * kMaxSlotLabelBytes + 64);
  spawner_ = std::thread([this] { spawner_loop(); });
}

void WorkerPool::shutdown() {
  std::vector<std::unique_ptr<Worker>> idle;
  {
    std::lock_guard lock(mu_);
    closing_ = true;
    idle.swap(idle_);
    live_ -= idle.size();
    for (pid_t pid : busy_) {
      ::kill(-pid, SIGKILL);  // its caller sees the result pipe close and reaps it
      ::kill(pid, SIGKILL);
    }
    freed_.notify_all();
  }
  for (auto& w : idle) end_of(*w);
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard lock(mu_);
    for (auto& w : idle_) end_of(*w);
    idle_.clear();
  }
  {
    std::lock_guard lock(spawn_mu_);
    stopping_ = true;
  }
  spawn_cv_.notify_all();
  spawner_.join();
}

WorkerPool::Stats WorkerPool::stats() const {
  std::lock_guard lock(mu_);
  Stats s = stats_;
  s.live = live_;
  return s;
}

void WorkerPool::spawner_loop() {
  std::unique_lock lock(spawn_mu_);
  for (;;) {
    spawn_cv_.wait(lock, [&] { return stopping_ || !spawn_queue_.empty(); });
    if (spawn_queue_.empty()) return;
    SpawnRequest* r = spawn_queue_.front();
    spawn_queue_.pop_front();
    lock.unlock();

    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, r->err_fd, STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&fa, r->err_fd, STDERR_FILENO);
    posix_spawn_file_actions_adddup2(&fa, r->call_fd, 3);
    posix_spawn_file_actions_adddup2(&fa, r->result_fd, 4);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t none, defaults;
    sigemptyset(&none);
    sigemptyset(&defaults);
    // Whatever the host ignores or blocks (SIGPIPE, a Python interpreter's choices) is
    // not the worker's business.
    for (int sig : {SIGPIPE, SIGINT, SIGQUIT, SIGTERM, SIGHUP, SIGXFSZ, SIGXCPU, SIGCHLD, SIGUSR1, SIGUSR2})
      sigaddset(&defaults, sig);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setpgroup(&attr, 0);  // its own process group: killed as a whole
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    std::vector<char*> argv;
    for (auto& a : r->argv) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, options_.executable.c_str(), &fa, &attr, argv.data(), environ);
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&fa);

    lock.lock();
    r->pid = rc == 0 ? pid : -1;
    r->error = rc;
    r->done = true;
    spawn_cv_.notify_all();
  }
}

std::unique_ptr<WorkerPool::Worker> WorkerPool::start_worker(std::int64_t deadline_ms, std::string& why) {
  int cp[2] = {-1, -1}, rp[2] = {-1, -1}, ep[2] = {-1, -1};
  if (pipe2(cp, O_CLOEXEC) != 0 || pipe2(rp, O_CLOEXEC) != 0 || pipe2(ep, O_CLOEXEC) != 0) {
    why = std::string("cannot create a pipe: ") + std::strerror(errno);
    for (int fd : {cp[0], cp[1], rp[0], rp[1], ep[0], ep[1]})
      if (fd >= 0) ::close(fd);
    return nullptr;
  }
  auto w = std::make_unique<Worker>();
  w->to = cp[1];
  w->from = rp[0];
  w->err = ep[0];

  for (int* fd : {&cp[0], &rp[1], &ep[1]}) move_above_stdio(*fd);
  SpawnRequest req;
  req.call_fd = cp[0];
  req.result_fd = rp[1];
  req.err_fd = ep[1];
  req.argv = {options_.executable, "--isolation-worker", "--parent-pid", std::to_string(getpid()),
              "--max-output-bytes", std::to_string(options_.max_output_bytes), "--max-request-bytes",
              std::to_string(options_.max_request_bytes)};
  for (const auto& p : plugins_) {
    if (p.empty()) {
      req.argv.push_back("--linked-tools");  // the host's own linked tools (it is this program too)
    } else {
      req.argv.push_back("--plugin");
      req.argv.push_back(p);
    }
  }
  const WorkerLimits& l = options_.limits;
  if (l.cpu_seconds) req.argv.insert(req.argv.end(), {"--limit-cpu-s", std::to_string(l.cpu_seconds)});
  if (l.address_space_mb) req.argv.insert(req.argv.end(), {"--limit-memory-mb", std::to_string(l.address_space_mb)});
  if (l.open_files) req.argv.insert(req.argv.end(), {"--limit-open-files", std::to_string(l.open_files)});
  if (l.file_size_mb) req.argv.insert(req.argv.end(), {"--limit-file-size-mb", std::to_string(l.file_size_mb)});
  if (l.no_network) req.argv.push_back("--no-network");
  {
    std::unique_lock lock(spawn_mu_);
    spawn_queue_.push_back(&req);
    spawn_cv_.notify_all();
    spawn_cv_.wait(lock, [&] { return req.done; });
  }
  w->to_keep = cp[0];
  ::close(rp[1]);
  ::close(ep[1]);
  if (req.pid < 0) {
    why = "cannot start " + options_.executable + ": " + std::strerror(req.error);
    return nullptr;
  }
  w->pid = req.pid;
  set_nonblocking(w->to);
  set_nonblocking(w->from);
  set_nonblocking(w->err);
  {
    std::lock_guard lock(mu_);
    ++stats_.started;
  }

  // The worker's greeting: the tools it registered, which must be the host's.
  const std::int64_t start_deadline = std::min(deadline_ms, steady_now_ms() + options_.start_timeout_ms);
  std::string& buf = w->rbuf;
  buf.clear();
  std::string fail;
  for (;;) {
    if (buf.size() >= worker::kFrameHeader) {
      std::uint32_t size = 0;
      worker::FrameType type{};
      worker::read_header(buf, size, type);
      if (type != worker::FrameType::hello || size > (64u << 20)) {
        fail = "sent something other than its greeting";
        break;
      }
      if (buf.size() >= worker::kFrameHeader + size) {
        worker::Hello hello;
        if (!worker::decode_hello(std::string_view(buf).substr(worker::kFrameHeader, size), hello)) {
          fail = "sent a malformed greeting";
          break;
        }
        std::sort(hello.aids.begin(), hello.aids.end());
        if (hello.aids != aids_) {
          fail = "registered other tools than the host (plugins changed on disk?)";
          break;
        }
        buf.clear();
        return w;
      }
    }
    pollfd fds[2] = {{w->from, POLLIN, 0}, {w->err, POLLIN, 0}};
    const int n = poll(fds, 2, poll_timeout(start_deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {
      fail = "did not start within " + std::to_string(options_.start_timeout_ms) + " ms";
      break;
    }
    if (fds[1].revents) {
      char chunk[4096];
      const ssize_t got = ::read(w->err, chunk, sizeof chunk);
      if (got > 0) {
        (void)!::write(STDERR_FILENO, chunk, static_cast<std::size_t>(got));
        w->tail.append(chunk, static_cast<std::size_t>(got));
        if (w->tail.size() > options_.stderr_tail_bytes) w->tail.erase(0, w->tail.size() - options_.stderr_tail_bytes);
      }
    }
    if (fds[0].revents) {
      char chunk[4096];
      const ssize_t got = ::read(w->from, chunk, sizeof chunk);
      if (got > 0) {
        buf.append(chunk, static_cast<std::size_t>(got));
      } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
        fail = "ended before it was ready";
        break;
      }
    }
  }
  why = "worker process " + fail + "; it " + end_of(*w);
  const std::string tail = to_valid_utf8(std::string_view(w->tail).substr(
      w->tail.size() > options_.stderr_tail_bytes ? w->tail.size() - options_.stderr_tail_bytes : 0));
  if (!tail.empty()) why += "; its last stderr: " + tail;
  return nullptr;
}

std::unique_ptr<WorkerPool::Worker> WorkerPool::acquire(std::int64_t deadline_ms, std::string& why, bool& timed_out) {
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
      busy_.push_back(w->pid);
      return w;
    }
    ++live_;
  }
  auto w = start_worker(deadline_ms, why);
  std::lock_guard lock(mu_);
  if (!w) {
    --live_;
    freed_.notify_one();
  } else if (closing_) {
    why = "the host is closed";
    --live_;
    end_of(*w);
    return nullptr;
  } else {
    busy_.push_back(w->pid);
  }
  return w;
}

void WorkerPool::release(std::unique_ptr<Worker> worker) {
  std::lock_guard lock(mu_);
  std::erase(busy_, worker->pid);
  if (closing_) {
    --live_;
    end_of(*worker);
    return;
  }
  idle_.push_back(std::move(worker));
  freed_.notify_one();
}

void WorkerPool::retire(pid_t pid) {
  std::lock_guard lock(mu_);
  std::erase(busy_, pid);
  --live_;
  freed_.notify_one();
}

std::string WorkerPool::end_of(Worker& w) {
  if (w.pid <= 0) return "was never started";
  // Killed even when it seems gone: a worker that closed its pipes may still be alive.
  // A worker already dying of its own signal or exit keeps that status.
  ::kill(-w.pid, SIGKILL);
  ::kill(w.pid, SIGKILL);
  int status = 0;
  pid_t got;
  do {
    got = waitpid(w.pid, &status, 0);
  } while (got < 0 && errno == EINTR);
  w.pid = -1;
  // What it wrote last (the pipe ends once its whole group is gone).
  const std::int64_t until = steady_now_ms() + 200;
  for (;;) {
    pollfd fd{w.err, POLLIN, 0};
    if (poll(&fd, 1, poll_timeout(until)) <= 0) break;
    char chunk[4096];
    const ssize_t n = ::read(w.err, chunk, sizeof chunk);
    if (n <= 0) break;
    (void)!::write(STDERR_FILENO, chunk, static_cast<std::size_t>(n));
    w.tail.append(chunk, static_cast<std::size_t>(n));
    if (w.tail.size() > options_.stderr_tail_bytes) w.tail.erase(0, w.tail.size() - options_.stderr_tail_bytes);
  }
  if (got < 0) return "ended (its exit status was collected by someone else)";
  return describe_wait_status(status);
}

WorkerPool::Outcome WorkerPool::run(std::string_view aid, std::string_view input_json, const Slots* state,
                                    std::int64_t deadline_ms, CallContext& call) {
  Outcome out;
  std::string why;
  bool queue_timeout = false;
  std::unique_ptr<Worker> w = acquire(deadline_ms, why, queue_timeout);
  if (!w) {
    bool closing;
    {
      std::lock_guard lock(mu_);
      closing = closing_;
    }
    out.ending = queue_timeout ? Ending::timed_out : closing ? Ending::closed : Ending::crashed;
    out.detail = why;
    return out;
  }

  const pid_t pid = w->pid;
  w->tail.clear();  // a crash report shows what this call's worker wrote
  std::string& frame = w->wbuf;
  frame.clear();
  worker::encode_call(aid, input_json, state, frame);
  // Most frames fit the pipe: write at once, poll only for what is left.
  std::size_t sent = 0;
  if (const ssize_t put = ::write(w->to, frame.data(), frame.size()); put > 0) {
    sent = static_cast<std::size_t>(put);
  }
  std::string& buf = w->rbuf;
  std::size_t have = 0;    // bytes of the reply in buf
  std::uint32_t want = 0;  // payload size once the header is in
  bool have_header = false;
  std::string fail;  // why the worker is lost, if it is
  bool timed_out = false;

  for (;;) {
    if (!have_header && have >= worker::kFrameHeader) {
      worker::FrameType type{};
      worker::read_header(std::string_view(buf.data(), have), want, type);
      if (type != worker::FrameType::result || want > max_result_bytes_) {
        fail = "the worker sent a malformed reply";
        break;
      }
      have_header = true;
    }
    if (have_header && have >= worker::kFrameHeader + want) break;

    pollfd fds[3] = {{w->from, POLLIN, 0}, {w->err, POLLIN, 0}, {sent < frame.size() ? w->to : -1, POLLOUT, 0}};
    const int n = poll(fds, 3, poll_timeout(deadline_ms));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail = std::string("poll failed: ") + std::strerror(errno);
      break;
    }
    if (n == 0) {
      timed_out = true;
      break;
    }
    if (fds[1].revents) {
      char chunk[4096];
      const ssize_t got = ::read(w->err, chunk, sizeof chunk);
      if (got > 0) {
        (void)!::write(STDERR_FILENO, chunk, static_cast<std::size_t>(got));
        w->tail.append(chunk, static_cast<std::size_t>(got));
        if (w->tail.size() > 2 * options_.stderr_tail_bytes)
          w->tail.erase(0, w->tail.size() - options_.stderr_tail_bytes);
      }
    }
    if ((fds[2].revents & POLLOUT) && sent < frame.size()) {
      const ssize_t put = ::write(w->to, frame.data() + sent, frame.size() - sent);
      if (put > 0) sent += static_cast<std::size_t>(put);
      else if (put < 0 && errno != EAGAIN && errno != EINTR) {
        fail = "the worker stopped reading";
        break;
      }
    }
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      // Up to the end of the frame once its size is known (at most 1 MiB more at a time).
      const std::size_t end = std::min<std::size_t>(have_header ? worker::kFrameHeader + want : have + 64 * 1024,
                                                    have + (1u << 20));
      if (buf.size() < end) buf.resize(end);
      const ssize_t got = ::read(w->from, buf.data() + have, end - have);
      if (got > 0) have += static_cast<std::size_t>(got);
      if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
        fail = "lost";
        break;
      }
    }
  }

  if (timed_out) {
    end_of(*w);
    {
      std::lock_guard lock(mu_);
      ++stats_.timed_out;
    }
    retire(pid);
    out.ending = Ending::timed_out;
    return out;
  }
  worker::Result result;
  if (fail.empty() &&
      !worker::decode_result(std::string_view(buf).substr(worker::kFrameHeader, want), result)) {
    fail = "the worker sent a malformed reply";
  }
  if (!fail.empty()) {
    const std::string how = end_of(*w);
    {
      std::lock_guard lock(mu_);
      ++stats_.crashed;
    }
    out.ending = Ending::crashed;
    out.detail = (fail == "lost" ? std::string() : fail + "; ") + "the worker process " + how;
    const std::string tail = to_valid_utf8(std::string_view(w->tail).substr(
        w->tail.size() > options_.stderr_tail_bytes ? w->tail.size() - options_.stderr_tail_bytes : 0));
    if (!tail.empty()) out.detail += "; its last stderr: " + tail;
    retire(pid);
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
