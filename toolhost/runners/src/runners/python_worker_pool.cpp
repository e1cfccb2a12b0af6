// See python_worker_pool.hpp. Starting, killing, reaping and watching workers; the calls
// they exchange are in python_worker_exchange.cpp.
#include "python_pool_worker.hpp"

#include <machina/errors.hpp>
#include <machina/isolation/sandbox_exec.hpp>
#include <machina/python_worker_source.hpp>
#include <machina/runners/python_worker_pool.hpp>
#include <machina/spin_wait.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace machina {
namespace {

/// The first child of `pid` (/proc/PID/task/PID/children); 0 if none (yet).
pid_t first_child(pid_t pid) {
  char path[96];
  std::snprintf(path, sizeof path, "/proc/%d/task/%d/children", static_cast<int>(pid), static_cast<int>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char text[64] = {};
  const ssize_t n = ::read(fd, text, sizeof text - 1);
  ::close(fd);
  return n > 0 ? static_cast<pid_t>(std::atoi(text)) : 0;
}

}  // namespace

PythonWorkerPool::PythonWorkerPool(PythonPoolOptions options)
    : options_(std::move(options)), spin_(may_run_on_two_cpus() ? options_.spin : std::chrono::microseconds(0)) {
  if (options_.workers < 1) throw ConfigError("a Python worker pool needs at least 1 worker");
  if (options_.queue_depth < 1) options_.queue_depth = 1;
  argv_ = options_.launcher;
  argv_.push_back(options_.python);
  // -u: the protocol stream is written unbuffered anyway; -c: the worker's own source,
  // so that any interpreter (another virtual environment) can run it.
  for (const char* a : {"-u", "-c"}) argv_.emplace_back(a);
  argv_.emplace_back(kPythonWorkerSource);
  argv_.emplace_back("--serve");
  if (options_.launcher.empty()) {  // (a sandbox's launcher sees to it itself)
    argv_.emplace_back("--die-with-parent");
    argv_.push_back(std::to_string(::getpid()));
  }
  for (const auto& root : options_.roots) {
    argv_.emplace_back("--root");
    argv_.push_back(root);
  }
  argv_.insert(argv_.end(), options_.worker_args.begin(), options_.worker_args.end());
  reaper_ = std::thread([this] { reap_loop(); });
}

PythonWorkerPool::~PythonWorkerPool() {
  close();
  {
    std::lock_guard lock(mu_);
    stop_reaper_ = true;
  }
  reap_cv_.notify_all();
  reaper_.join();
}

std::shared_ptr<PythonWorkerPool::Worker> PythonWorkerPool::start() {
  ChildSpec spec;
  spec.executable = argv_.front();
  spec.argv = argv_;
  spec.env = options_.env;
  spec.stdio = ChildSpec::Stdio::pipes;
  spec.tail_bytes = options_.stderr_tail_bytes;
  if (!options_.cwd.empty())
    spec.cwd = options_.cwd;
  else if (!options_.roots.empty())
    spec.cwd = options_.roots.front();
  auto w = std::make_shared<Worker>();
  w->child = std::make_unique<ChildProcess>(spec, &spawner_);
  w->child->drain_in_background();
  w->pid = w->child->pid();
  return w;
}

void PythonWorkerPool::reap_loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    reap_cv_.wait(lock, [&] { return stop_reaper_ || !to_reap_.empty(); });
    if (to_reap_.empty()) return;
    auto batch = std::move(to_reap_);
    to_reap_.clear();
    // Retired workers are replaced now, not when the next call needs one: the pool is filled
    // up to its size, so that calls that come one after the other find one started earlier.
    while (refill_ && !closing_ && workers_.size() + starting_ < options_.workers) {
      ++starting_;
      lock.unlock();
      std::shared_ptr<Worker> fresh;
      try {
        fresh = start();
      } catch (const ConfigError&) {
        // (the next call starts one itself, and says why it cannot)
      }
      lock.lock();
      --starting_;
      if (fresh) {
        ++stats_.started;
        workers_.push_back(fresh);
        if (closing_) kill(*fresh, "the Python worker pool was closed");
      }
      changed_.notify_all();
    }
    refill_ = false;
    lock.unlock();
    for (auto& w : batch) w->child->end(100);
    batch.clear();
    lock.lock();
  }
}

void PythonWorkerPool::kill(Worker& w, std::string why) {
  if (w.dead) return;
  w.dead = true;
  w.kill_reason = std::move(why);
  w.child->kill();
  // Out of the pool at once, so that a replacement may start; whoever reads it next sees
  // its end and settles its calls; the reaper reaps it.
  retire(w);
  changed_.notify_all();
  // Nobody reading it: settle its calls now (its reader would have).
  if (!w.reading) lost(w, w.kill_reason + tail_note(w.child->tail()));
}

void PythonWorkerPool::retire(Worker& w) {
  for (auto it = workers_.begin(); it != workers_.end(); ++it) {
    if (it->get() == &w) {
      to_reap_.push_back(*it);
      workers_.erase(it);
      break;
    }
  }
  if (!closing_) ++stats_.replaced;
  reap_cv_.notify_all();
}

void PythonWorkerPool::lost(Worker& w, const std::string& why) {
  if (w.settled) return;
  w.settled = true;
  if (!w.dead) {
    w.dead = true;
    retire(w);
  }
  bool first = !w.running_settled;  // the first in the queue may have started; none after it has
  for (auto& call : w.queue) {
    if (call->state == Pending::State::waiting) {
      if (closing_) {
        call->state = Pending::State::failed;
        call->result = {Exchange::Ending::closed, {}, "the Python worker pool was closed", w.pid};
      } else if (first) {
        call->state = Pending::State::failed;
        call->result = {Exchange::Ending::crashed, {}, "its Python worker " + std::to_string(w.pid) + " " + why, w.pid};
      } else {
        call->state = Pending::State::requeue;  // it never started
      }
      call->cv.notify_one();
    }
    first = false;
  }
  w.queue.clear();
  changed_.notify_all();
}

pid_t PythonWorkerPool::interpreter_of(Worker& w) const {
  if (w.interpreter == 0) {
    if (options_.launcher.empty()) {
      w.interpreter = w.pid;
    } else {  // launcher -> the sandbox's init -> the interpreter
      const pid_t init = first_child(w.pid);
      w.interpreter = init > 0 ? first_child(init) : 0;
    }
  }
  return w.interpreter;
}

std::uint64_t PythonWorkerPool::interpreter_mb(Worker& w) const {
  const pid_t pid = interpreter_of(w);
  return pid == 0 ? 0 : sandbox::resident_mb(pid);
}

std::size_t PythonWorkerPool::interpreter_threads(Worker& w) const {
  const pid_t pid = interpreter_of(w);
  if (pid == 0) return 0;
  // A process's task folder has a link for each of its threads, and two more.
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/task", static_cast<int>(pid));
  struct stat st{};
  if (::stat(path, &st) != 0 || st.st_nlink < 2) return 0;
  return static_cast<std::size_t>(st.st_nlink - 2);
}

void PythonWorkerPool::condemn(pid_t pid, const std::string& why) {
  std::lock_guard lock(mu_);
  for (const auto& w : workers_) {
    if (w->pid == pid) {
      kill(*w, why);
      return;
    }
  }
}

void PythonWorkerPool::close() {
  std::lock_guard lock(mu_);
  if (closing_) return;
  closing_ = true;
  auto workers = workers_;
  for (auto& w : workers) kill(*w, "the Python worker pool was closed");
  changed_.notify_all();
}

std::string PythonWorkerPool::python_env() const {
  if (env_known_.load(std::memory_order_acquire)) return python_env_;
  const std::filesystem::path bin = std::filesystem::path(options_.python).parent_path();
  return bin.has_parent_path() ? bin.parent_path().string() : bin.string();
}

void PythonWorkerPool::reported_python_env(std::string_view env) {
  if (env_known_.load(std::memory_order_acquire)) return;
  std::lock_guard lock(mu_);
  if (env_known_.load(std::memory_order_relaxed)) return;
  python_env_ = env;
  env_known_.store(true, std::memory_order_release);
}

PythonWorkerPool::Stats PythonWorkerPool::stats() const {
  std::lock_guard lock(mu_);
  Stats s = stats_;
  s.live = workers_.size();
  return s;
}

}  // namespace machina
