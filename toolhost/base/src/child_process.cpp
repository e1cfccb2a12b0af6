// See child_process.hpp.
#include <machina/child_process.hpp>
#include <machina/errors.hpp>
#include <machina/fd_io.hpp>
#include <machina/json_text.hpp>

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

extern char** environ;

namespace machina {

struct Spawner::Job {
  const ChildSpec* spec = nullptr;
  int stdin_fd = -1;  // the child's ends (-1: /dev/null, or the output pipe)
  int stdout_fd = -1;
  int output_fd = -1;                    // stderr (and stdout when shared)
  std::vector<std::pair<int, int>> fds;  // spec.fds, from copies no dup2 can clobber
  pid_t pid = -1;
  int error = 0;
  bool done = false;
};

namespace {

using Clock = std::chrono::steady_clock;

/// posix_spawn with the child in its own process group, default signal handling for
/// everything this process may ignore or block (SIGPIPE, an interpreter's choices), and
/// exactly the environment and descriptors asked for.
void spawn_now(Spawner::Job& job) {
  const ChildSpec& spec = *job.spec;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (job.stdin_fd >= 0)
    posix_spawn_file_actions_adddup2(&fa, job.stdin_fd, STDIN_FILENO);
  else
    posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, job.stdout_fd >= 0 ? job.stdout_fd : job.output_fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&fa, job.output_fd, STDERR_FILENO);
  for (const auto& [here, there] : job.fds) posix_spawn_file_actions_adddup2(&fa, here, there);
  if (!spec.cwd.empty()) posix_spawn_file_actions_addchdir_np(&fa, spec.cwd.c_str());
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int sig : {SIGPIPE, SIGINT, SIGQUIT, SIGTERM, SIGHUP, SIGXFSZ, SIGXCPU, SIGCHLD, SIGUSR1, SIGUSR2})
    sigaddset(&defaults, sig);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::vector<char*> argv, envp;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  pid_t pid = -1;
  job.error =
      posix_spawn(&pid, spec.executable.c_str(), &fa, &attr, argv.data(), spec.inherit_env ? environ : envp.data());
  job.pid = job.error == 0 ? pid : -1;
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&fa);
}

/// A close-on-exec pipe; throws ConfigError.
void make_pipe(int (&fds)[2]) {
  if (pipe2(fds, O_CLOEXEC) != 0) throw ConfigError(std::string("cannot create a pipe: ") + std::strerror(errno));
}

}  // namespace

ssize_t write_quietly(int fd, const char* data, std::size_t n) {
  sigset_t pipe_only, old;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_only, &old);
  const ssize_t w = ::write(fd, data, n);
  const int saved = errno;
  if (w < 0 && saved == EPIPE && !sigismember(&old, SIGPIPE)) {
    const timespec now{};
    while (sigtimedwait(&pipe_only, nullptr, &now) < 0 && errno == EINTR) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  errno = saved;
  return w;
}

namespace {

int millis_until(Clock::time_point t) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<std::int64_t>(left + 1, 1 << 30));
}

}  // namespace

Spawner::Spawner() = default;

Spawner::~Spawner() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Spawner::run(Job& job) {
  std::unique_lock lock(mu_);
  // Started by the first child: a host that never starts one (a --run of a tool that
  // spawns nothing) does not pay for the thread.
  if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  queue_.push_back(&job);
  cv_.notify_all();
  cv_.wait(lock, [&] { return job.done; });
}

void Spawner::loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;
    Job* job = queue_.front();
    queue_.pop_front();
    lock.unlock();
    spawn_now(*job);
    lock.lock();
    job->done = true;
    cv_.notify_all();
  }
}

ChildProcess::ChildProcess(const ChildSpec& spec, Spawner* spawner)
    : echo_(spec.stdio == ChildSpec::Stdio::shared_output), tail_bytes_(spec.tail_bytes) {
  // Every descriptor handed over is first copied above every target, so that no dup2 of
  // the spawn overwrites another one (an embedding program with stdin closed gets low
  // descriptors from pipe2).
  int floor = 3;
  for (const auto& [here, there] : spec.fds) floor = std::max(floor, there + 1);
  Spawner::Job job;
  job.spec = &spec;
  auto close_copies = [&] {
    close_fd(job.stdin_fd);
    close_fd(job.stdout_fd);
    close_fd(job.output_fd);
    for (auto& [copy, there] : job.fds) ::close(copy);
    job.fds.clear();
  };
  // Each pipe: our end kept, the child's end copied above the floor.
  auto pipe_for_child = [&](int& ours, int& theirs, bool child_reads) {
    int fds[2] = {-1, -1};
    make_pipe(fds);
    ours = child_reads ? fds[1] : fds[0];
    const int child_end = child_reads ? fds[0] : fds[1];
    theirs = fcntl(child_end, F_DUPFD_CLOEXEC, floor);
    const int saved = errno;
    ::close(child_end);
    if (theirs < 0) throw ConfigError(std::string("cannot copy a descriptor: ") + std::strerror(saved));
  };
  try {
    pipe_for_child(out_, job.output_fd, false);
    if (spec.stdio == ChildSpec::Stdio::pipes) {
      pipe_for_child(in_, job.stdin_fd, true);
      pipe_for_child(stdout_, job.stdout_fd, false);
    }
    for (const auto& [here, there] : spec.fds) {
      const int copy = fcntl(here, F_DUPFD_CLOEXEC, floor);
      if (copy < 0) throw ConfigError(std::string("cannot copy a descriptor: ") + std::strerror(errno));
      job.fds.emplace_back(copy, there);
    }
  } catch (...) {
    close_copies();
    close_fd(out_);
    close_fd(in_);
    close_fd(stdout_);
    throw;
  }
  if (spawner != nullptr)
    spawner->run(job);
  else
    spawn_now(job);
  close_copies();
  if (job.pid < 0) {
    close_fd(out_);
    close_fd(in_);
    close_fd(stdout_);
    throw StartError("cannot start " + spec.executable + ": " + std::strerror(job.error), job.error);
  }
  pid_ = job.pid;
  pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));  // -1 on old kernels: waits poll
  for (int fd : {out_, in_, stdout_}) {
    if (fd >= 0) set_nonblocking(fd);
  }
}

ChildProcess::~ChildProcess() {
  end(0);
  close_fd(out_);
  close_fd(in_);
  close_fd(stdout_);
  close_fd(pidfd_);
}

void ChildProcess::keep(const char* data, std::size_t n) {
  if (echo_) (void)!::write(STDERR_FILENO, data, n);
  std::lock_guard lock(tail_mu_);
  tail_.append(data, n);
  if (tail_.size() > 2 * tail_bytes_) tail_.erase(0, tail_.size() - tail_bytes_);
}

void ChildProcess::clear_tail() {
  std::lock_guard lock(tail_mu_);
  tail_.clear();
}

std::string ChildProcess::tail() const {
  std::lock_guard lock(tail_mu_);
  const std::string_view t(tail_);
  return to_valid_utf8(t.substr(t.size() > tail_bytes_ ? t.size() - tail_bytes_ : 0));
}

void ChildProcess::close_input() {
  if (in_ < 0) return;
  const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null < 0) throw ConfigError(std::string("cannot open /dev/null: ") + std::strerror(errno));
  ::dup3(null, in_, O_CLOEXEC);
  ::close(null);
}

bool ChildProcess::exited() const {
  if (ended()) return true;
  siginfo_t info{};
  if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0) return errno == ECHILD;
  return info.si_pid != 0;
}

bool ChildProcess::wait_exit(std::chrono::milliseconds limit) const {
  const auto until = Clock::now() + limit;
  if (pidfd_ >= 0) {
    for (;;) {
      if (ended()) return true;
      pollfd fd{pidfd_, POLLIN, 0};
      const int n = ::poll(&fd, 1, millis_until(until));
      if (n > 0) return true;
      if (n == 0 || errno != EINTR) return exited();
    }
  }
  auto delay = std::chrono::microseconds(500);
  while (!exited()) {
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(delay);
    delay = std::min(delay * 2, std::chrono::microseconds(20000));
  }
  return true;
}

void ChildProcess::kill() {
  std::lock_guard lock(reap_mu_);
  if (ended()) return;
  ::kill(-pid_, SIGKILL);
  ::kill(pid_, SIGKILL);
}

bool ChildProcess::read_output() {
  if (out_ < 0) return false;
  char chunk[4096];
  for (;;) {
    const ssize_t n = ::read(out_, chunk, sizeof chunk);
    if (n > 0) {
      keep(chunk, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && errno == EAGAIN;
  }
}

void ChildProcess::drain_in_background() {
  if (drainer_.joinable() || out_ < 0 || ended()) return;
  make_pipe(wake_);
  drainer_ = std::thread([this] { drain_loop(); });
}

void ChildProcess::drain_loop() {
  for (;;) {
    pollfd fds[2] = {{out_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[1].revents != 0) return;
    if (fds[0].revents != 0 && !read_output()) break;
  }
  std::lock_guard lock(tail_mu_);
  drained_ = true;
  drained_cv_.notify_all();
}

void ChildProcess::stop_draining(int drain_ms) {
  if (!drainer_.joinable()) return;
  {
    std::unique_lock lock(tail_mu_);
    drained_cv_.wait_for(lock, std::chrono::milliseconds(drain_ms), [&] { return drained_; });
  }
  (void)!::write(wake_[1], "x", 1);
  drainer_.join();
  close_fd(wake_[0]);
  close_fd(wake_[1]);
}

const std::string& ChildProcess::end(int drain_ms) {
  std::lock_guard once(end_mu_);
  if (ended()) return how_;
  {
    // Killed even when it seems gone: a child that closed its pipes may still be alive,
    // and whatever it started is still in its group. A child already dying of its own
    // signal or exit keeps that status.
    std::lock_guard lock(reap_mu_);
    ::kill(-pid_, SIGKILL);
    ::kill(pid_, SIGKILL);
    int status = 0;
    pid_t got;
    do {
      got = waitpid(pid_, &status, 0);
    } while (got < 0 && errno == EINTR);
    status_ = got < 0 ? 0 : status;
    how_ = got < 0 ? "ended (its exit status was collected by someone else)" : describe_wait_status(status);
    reaped_.store(true, std::memory_order_release);
  }
  // What it wrote last (the pipe ends once every process holding it is gone).
  if (drainer_.joinable()) {
    stop_draining(drain_ms);
    return how_;
  }
  const auto until = Clock::now() + std::chrono::milliseconds(drain_ms);
  while (out_ >= 0) {
    pollfd fd{out_, POLLIN, 0};
    const int left = millis_until(until);
    if (left <= 0 || poll(&fd, 1, left) <= 0) break;
    if (!read_output()) break;
  }
  return how_;
}

int ChildProcess::exit_code() const {
  return exit_code_of(status_);
}

ChildOutcome run_to_completion(ChildSpec spec, std::string_view input, std::chrono::milliseconds limit,
                               std::size_t max_stdout) {
  spec.stdio = ChildSpec::Stdio::pipes;
  ChildProcess child(spec);
  ChildOutcome r;
  const auto until = Clock::now() + limit;
  std::size_t sent = 0;
  bool writing = !input.empty(), reading_out = true, reading_err = true, over = false, late = false;
  if (!writing) child.close_input();
  char chunk[65536];
  while (reading_out || reading_err) {
    int wait = millis_until(until);
    if (wait <= 0) {
      late = true;
      break;
    }
    if (!reading_out) {
      // The answer is complete. stderr may be held open by what a stuck tool started;
      // once the child itself has exited, that is all there is.
      if (child.exited()) {
        child.read_output();
        break;
      }
      wait = std::min(wait, 10);
    }
    pollfd fds[3];
    nfds_t n = 0;
    if (writing) fds[n++] = {child.input_fd(), POLLOUT, 0};
    if (reading_out) fds[n++] = {child.stdout_fd(), POLLIN, 0};
    if (reading_err) fds[n++] = {child.output_fd(), POLLIN, 0};
    if (::poll(fds, n, wait) < 0 && errno != EINTR) break;
    for (nfds_t i = 0; i < n; ++i) {
      if (fds[i].revents == 0) continue;
      const int fd = fds[i].fd;
      if (writing && fd == child.input_fd()) {
        const ssize_t w = write_quietly(fd, input.data() + sent, input.size() - sent);
        if (w > 0) sent += static_cast<std::size_t>(w);
        // Done, or the child stopped reading (its answer says why).
        if (sent == input.size() || (w < 0 && errno != EAGAIN && errno != EINTR)) {
          writing = false;
          child.close_input();
        }
      } else if (reading_out && fd == child.stdout_fd()) {
        const ssize_t got = ::read(fd, chunk, sizeof chunk);
        if (got > 0) {
          r.stdout_text.append(chunk, static_cast<std::size_t>(got));
          if (r.stdout_text.size() > max_stdout) {
            over = true;
            break;
          }
        } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
          reading_out = false;
        }
      } else if (reading_err && fd == child.output_fd()) {
        if (!child.read_output()) reading_err = false;
      }
    }
    if (over) break;
  }
  if (over || late || reading_out) child.kill();
  // The child has until the deadline to exit; then its group is killed (end()), while it
  // is still unreaped, and it is reaped.
  child.wait_exit(std::chrono::milliseconds(std::max(50, millis_until(until))));
  r.how = child.end(over || late ? 0 : 50);
  r.exit_code = child.exit_code();
  r.tail = child.tail();
  r.ended = over   ? ChildOutcome::Ended::output_over_cap
            : late ? ChildOutcome::Ended::timed_out
                   : ChildOutcome::Ended::exited;
  return r;
}

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

int exit_code_of(int status) {
  if (WIFSIGNALED(status)) return -WTERMSIG(status);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return status;
}

std::vector<std::string> pick_environment(const std::vector<std::string>& pass) {
  std::vector<std::string> env;
  for (const auto& name : pass) {
    if (const char* value = std::getenv(name.c_str())) env.push_back(name + "=" + value);
  }
  return env;
}

}  // namespace machina
