// See child_process.hpp.
#include <machina/child_process.hpp>
#include <machina/errors.hpp>
#include <machina/json_text.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

extern char** environ;

namespace machina {

struct Spawner::Job {
  const ChildSpec* spec = nullptr;
  int output_fd = -1;                    // the child's stdout and stderr
  std::vector<std::pair<int, int>> fds;  // spec.fds, from copies no dup2 can clobber
  pid_t pid = -1;
  int error = 0;
  bool done = false;
};

namespace {

/// posix_spawn with the child in its own process group, default signal handling for
/// everything this process may ignore or block (SIGPIPE, an interpreter's choices), and
/// exactly the environment and descriptors asked for.
void spawn_now(Spawner::Job& job) {
  const ChildSpec& spec = *job.spec;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, job.output_fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&fa, job.output_fd, STDERR_FILENO);
  for (const auto& [here, there] : job.fds) posix_spawn_file_actions_adddup2(&fa, here, there);
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
  job.error = posix_spawn(&pid, spec.executable.c_str(), &fa, &attr, argv.data(), envp.data());
  job.pid = job.error == 0 ? pid : -1;
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&fa);
}


}  // namespace

Spawner::Spawner() : thread_([this] { loop(); }) {}

Spawner::~Spawner() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Spawner::run(Job& job) {
  std::unique_lock lock(mu_);
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

ChildProcess::ChildProcess(const ChildSpec& spec, Spawner* spawner) : tail_bytes_(spec.tail_bytes) {
  // Every descriptor handed over is first copied above every target, so that no dup2 of
  // the spawn overwrites another one (an embedding program with stdin closed gets low
  // descriptors from pipe2).
  int floor = 3;
  for (const auto& [here, there] : spec.fds) floor = std::max(floor, there + 1);
  Spawner::Job job;
  job.spec = &spec;
  auto close_copies = [&] {
    if (job.output_fd >= 0) ::close(job.output_fd);
    for (const auto& [copy, there] : job.fds) ::close(copy);
  };
  int fds[2] = {-1, -1};
  if (pipe2(fds, O_CLOEXEC) != 0) throw HostError(std::string("cannot create a pipe: ") + std::strerror(errno));
  out_ = fds[0];
  job.output_fd = fcntl(fds[1], F_DUPFD_CLOEXEC, floor);
  ::close(fds[1]);
  bool copied = job.output_fd >= 0;
  for (const auto& [here, there] : spec.fds) {
    const int copy = copied ? fcntl(here, F_DUPFD_CLOEXEC, floor) : -1;
    if (copy < 0) copied = false;
    else job.fds.emplace_back(copy, there);
  }
  if (!copied) {
    const int saved = errno;
    close_copies();
    ::close(out_);
    out_ = -1;
    throw HostError(std::string("cannot copy a descriptor: ") + std::strerror(saved));
  }
  if (spawner != nullptr) spawner->run(job);
  else spawn_now(job);
  close_copies();
  if (job.pid < 0) {
    ::close(out_);
    out_ = -1;
    throw HostError("cannot start " + spec.executable + ": " + std::strerror(job.error));
  }
  pid_ = job.pid;
  fcntl(out_, F_SETFL, fcntl(out_, F_GETFL) | O_NONBLOCK);
}

ChildProcess::~ChildProcess() {
  if (!ended()) end(0);
  if (out_ >= 0) ::close(out_);
}

void ChildProcess::keep(const char* data, std::size_t n) {
  (void)!::write(STDERR_FILENO, data, n);
  tail_.append(data, n);
  if (tail_.size() > 2 * tail_bytes_) tail_.erase(0, tail_.size() - tail_bytes_);
}

bool ChildProcess::exited() const {
  if (pid_ < 0) return true;
  siginfo_t info{};
  if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0) return errno == ECHILD;
  return info.si_pid != 0;
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

std::string ChildProcess::tail() const {
  const std::string_view t(tail_);
  return to_valid_utf8(t.substr(t.size() > tail_bytes_ ? t.size() - tail_bytes_ : 0));
}

const std::string& ChildProcess::end(int drain_ms) {
  if (ended()) return how_;
  // Killed even when it seems gone: a child that closed its pipes may still be alive. A
  // child already dying of its own signal or exit keeps that status.
  ::kill(-pid_, SIGKILL);
  ::kill(pid_, SIGKILL);
  int status = 0;
  pid_t got;
  do {
    got = waitpid(pid_, &status, 0);
  } while (got < 0 && errno == EINTR);
  pid_ = -1;
  how_ = got < 0 ? "ended (its exit status was collected by someone else)" : describe_wait_status(status);
  // What it wrote last (the pipe ends once every process holding it is gone).
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(drain_ms);
  while (out_ >= 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    pollfd fd{out_, POLLIN, 0};
    if (left.count() <= 0 || poll(&fd, 1, static_cast<int>(left.count())) <= 0) break;
    if (!read_output()) break;
  }
  return how_;
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

std::vector<std::string> pick_environment(const std::vector<std::string>& pass) {
  std::vector<std::string> env;
  for (const auto& name : pass) {
    if (const char* value = std::getenv(name.c_str())) env.push_back(name + "=" + value);
  }
  return env;
}

}  // namespace machina
