// See python_runner.hpp.
#include <machina/errors.hpp>
#include <machina/clock.hpp>
#include <machina/isolation/sandbox_exec.hpp>
#include <machina/json_text.hpp>
#include <machina/python_worker_source.hpp>
#include <machina/runners/python_runner.hpp>
#include <machina/spin_wait.hpp>
#include <machina/tool.hpp>
#include <machina/tool_protocol.hpp>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <map>

namespace machina {
namespace {

using Clock = std::chrono::steady_clock;

/// How often a worker with a memory cap is looked at while it runs.
constexpr int kMemoryCheckMs = 50;
/// How often a call goes to another worker because its worker ended before it started.
constexpr int kMaxRequeues = 3;

/// The environment (`sys.prefix`) of the interpreter at `python`: what its workers last
/// reported, else what its layout gives without starting it (the folder above `bin/`: a
/// virtual environment, or the prefix a Python is installed under).
class PythonEnvs {
 public:
  void reported(const std::string& python, const nlohmann::ordered_json& env) {
    if (!env.is_string()) return;
    std::lock_guard lock(mu_);
    if (envs_.size() < kMaxInterpreters || envs_.contains(python)) envs_[python] = env.get<std::string>();
  }
  std::string of(const std::string& python) {
    {
      std::lock_guard lock(mu_);
      if (auto it = envs_.find(python); it != envs_.end()) return it->second;
    }
    const std::filesystem::path bin = std::filesystem::path(python).parent_path();
    return bin.has_parent_path() ? bin.parent_path().string() : bin.string();
  }

 private:
  static constexpr std::size_t kMaxInterpreters = 256;
  std::mutex mu_;
  std::map<std::string, std::string> envs_;
};

PythonEnvs& python_envs() {
  static PythonEnvs envs;
  return envs;
}

/// The `trace` of a call: what the worker reported (what the tool printed, its interpreter)
/// and what the host knows (runner, source, deadline, duration, enforcement).
std::string make_trace(const PythonRunner::ToolFields& f, const PythonPoolOptions& o, std::string_view worker_trace,
                       const std::string& trace_id, std::int64_t timeout_ms, double duration_ms, pid_t pid,
                       const tool_protocol::Answer* answer) {
  nlohmann::ordered_json t = nlohmann::ordered_json::object();
  t["runner"] = "local";
  t["kind"] = "python";
  t["resolved_source"] = f.resolved_source;
  if (!f.pack_id.empty()) {
    t["pack_id"] = f.pack_id;
    t["pack_name"] = f.pack_name;
    t["pack_version"] = f.pack_version;
    t["deps_source"] = f.deps_source;
  }
  t["tool"] = f.name;
  t["entry"] = f.entry;
  t["protocol_version"] = tool_protocol::kVersion;
  t["timeout_ms"] = timeout_ms;
  t["duration_ms"] = duration_ms;
  t["python_path"] = o.python;
  t["python_env"] = nullptr;
  t["sandbox"] = f.sandbox;
  t["trace_id"] = trace_id;
  if (pid > 0) t["worker_pid"] = pid;
  if (!worker_trace.empty()) {
    const auto w = nlohmann::ordered_json::parse(worker_trace, nullptr, /*allow_exceptions=*/false);
    if (w.is_object()) {
      for (const auto& [k, v] : w.items()) {
        if (k == "duration_ms") t["tool_duration_ms"] = v;
        else if (k == "python_path" || k == "python_env" || k == "stdout" || k == "stderr" ||
                 k == "output_truncated" || k == "module_reloaded")
          t[k] = v;
      }
    }
  }
  if (t["python_env"].is_null()) t["python_env"] = python_envs().of(o.python);  // (no word from the worker)
  else python_envs().reported(o.python, t["python_env"]);
  if (!f.enforcement_json.empty()) {
    const auto e = nlohmann::ordered_json::parse(f.enforcement_json, nullptr, false);
    if (e.is_object()) {
      t["enforcement_level"] = e.empty() ? "none" : "enforced";
      t["enforcement"] = e;
    }
  } else {
    t["enforcement_level"] = "none";
  }
  if (!f.refusal.empty()) {
    t["enforcement_level"] = "not_enforceable";
    t["reason_code"] = "guarantee_blocked";
  }
  if (answer != nullptr && !answer->ok) {
    t["error_type"] = answer->error_type;
    t["error_message"] = answer->error_message;
    if (!answer->reason_code.empty()) t["reason_code"] = answer->reason_code;
  }
  return t.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

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

std::string tail_note(const std::string& tail) {
  std::string text = tail;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text.empty() ? "" : "; stderr: " + text;
}

}  // namespace

// --- the pool ---------------------------------------------------------------------------

/// One call sent to a worker (or about to be), waiting for its answer. Guarded by mu_.
struct PythonWorkerPool::Pending {
  enum class State { waiting, answered, failed, requeue, abandoned };
  std::int64_t deadline_ms = 0;
  State state = State::waiting;
  bool cancelled = false;  // by its caller (see cancel_call)
  const Retire* retire = nullptr;
  std::string caller;
  Exchange result;
  std::condition_variable cv;  // settled, or it may now read its worker's answers
};

/// One worker. Whoever waits for an answer from it reads its answers (one caller at a time:
/// `reading`), settling the calls they answer in order and handing the reading on, so that
/// an answer wakes only the caller it is for.
struct PythonWorkerPool::Worker {
  std::unique_ptr<ChildProcess> child;
  pid_t pid = 0;
  pid_t interpreter = 0;  // the interpreter's own pid (below a sandbox's launcher and init); 0: not yet found
  std::deque<std::shared_ptr<Pending>> queue;  // sent, not yet answered: the first is running
  std::mutex write_mu;                         // one request line written at a time
  std::string buffer;                          // read and not yet taken (by the reader)
  bool reading = false;                        // a caller is reading its answers
  bool dead = false;                           // killed or ended: takes no more calls
  bool settled = false;                        // its end was handled (lost())
  std::string kill_reason;                     // why it was killed, for the call it was running
  bool running_settled = false;                // the call it was running was answered at its deadline
  bool taken = false;                          // it has taken a call (of `caller`'s)
  std::string caller;                          // whose calls it takes, once taken
};

PythonWorkerPool::PythonWorkerPool(PythonPoolOptions options)
    : options_(std::move(options)),
      spin_(may_run_on_two_cpus() ? options_.spin : std::chrono::microseconds(0)) {
  if (options_.workers < 1) throw HostError("a Python worker pool needs at least 1 worker");
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
  if (!options_.cwd.empty()) spec.cwd = options_.cwd;
  else if (!options_.roots.empty()) spec.cwd = options_.roots.front();
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
      } catch (const HostError&) {
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
  struct stat st {};
  if (::stat(path, &st) != 0 || st.st_nlink < 2) return 0;
  return static_cast<std::size_t>(st.st_nlink - 2);
}

void PythonWorkerPool::take_answers(Worker& w) {
  std::size_t at = 0;
  for (std::size_t nl; (nl = w.buffer.find('\n', at)) != std::string::npos; at = nl + 1) {
    if (w.queue.empty()) {
      kill(w, "wrote an answer to no call (it broke tool protocol v1) and was replaced");
      w.buffer.clear();
      return;
    }
    auto call = std::move(w.queue.front());
    w.queue.pop_front();
    if (call->state != Pending::State::waiting) continue;  // abandoned at its deadline
    if (options_.memory_mb > 0) {
      if (const auto mb = interpreter_mb(w); mb > options_.memory_mb) {
        call->state = Pending::State::failed;
        call->result = {Exchange::Ending::crashed, {},
                        "its Python worker " + std::to_string(w.pid) + " grew past its memory cap of " +
                            std::to_string(options_.memory_mb) + " MiB (resident " + std::to_string(mb) +
                            " MiB) and was replaced",
                        w.pid};
        call->cv.notify_one();
        w.running_settled = true;  // (the next may have started: it fails too, with the reason)
        kill(w, "was killed: it grew past its memory cap of " + std::to_string(options_.memory_mb) + " MiB");
        w.buffer.clear();
        return;
      }
    }
    call->state = Pending::State::answered;
    call->result = {Exchange::Ending::answered, w.buffer.substr(at, nl - at), {}, w.pid};
    // Answered every call sent to it, it waits for the next: a thread still there was
    // started by a call and left running (it would run beside the next call).
    const char* retire_why = nullptr;
    if (call->retire != nullptr && (*call->retire)(call->result.answer)) retire_why = "was retired after its call";
    else if (w.queue.empty() && interpreter_threads(w) > 1) retire_why = "left threads running after its call";
    call->result.retired = retire_why != nullptr;
    call->cv.notify_one();
    if (retire_why != nullptr) {
      if (options_.replace_retired) refill_ = true;
      kill(w, std::string(retire_why) + " and was replaced");
      w.buffer.clear();
      return;
    }
  }
  w.buffer.erase(0, at);
  if (w.buffer.size() > options_.max_answer_bytes) {
    kill(w, "wrote an answer over " + std::to_string(options_.max_answer_bytes) + " bytes and was replaced");
    w.buffer.clear();
  }
  changed_.notify_all();  // room in its queue
}

void PythonWorkerPool::read_for(Worker& w, Pending& call, std::unique_lock<std::mutex>& lock) {
  w.reading = true;
  const bool watch = options_.memory_mb > 0;
  char chunk[64 * 1024];
  bool ended = false;
  while (call.state == Pending::State::waiting && !w.dead) {
    const std::int64_t left = call.deadline_ms - steady_now_ms();
    if (left <= 0) break;
    // Spinning pays for a lone call; with calls queued, CPUs are better left to the workers.
    std::size_t in_flight = 0;
    for (const auto& other : workers_) in_flight += other->queue.size();
    const bool spin = spin_.count() > 0 && in_flight <= 1;
    lock.unlock();
    ssize_t n = ::read(w.child->stdout_fd(), chunk, sizeof chunk);
    // A quick tool's answer is a few tens of microseconds away: waiting for it awake costs
    // less than a sleep and a wake-up (only when the worker can run meanwhile).
    if (n < 0 && errno == EAGAIN && spin && spin_until_readable(w.child->stdout_fd(), spin_)) {
      n = ::read(w.child->stdout_fd(), chunk, sizeof chunk);
    }
    if (n < 0 && errno == EAGAIN) {
      pollfd p{w.child->stdout_fd(), POLLIN, 0};
      const int wait = static_cast<int>(std::min<std::int64_t>(left, watch ? kMemoryCheckMs : 1 << 30));
      if (::poll(&p, 1, wait) > 0) n = ::read(w.child->stdout_fd(), chunk, sizeof chunk);
    }
    const bool over = watch && n < 0 && errno == EAGAIN && interpreter_mb(w) > options_.memory_mb;
    lock.lock();
    if (n > 0) {
      w.buffer.append(chunk, static_cast<std::size_t>(n));
      take_answers(w);
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
      ended = true;
      break;
    } else if (over) {
      kill(w, "was killed: it grew past its memory cap of " + std::to_string(options_.memory_mb) + " MiB");
    }
  }
  w.reading = false;
  if (ended || w.dead) {
    if (!w.settled) {
      // It has ended (or was killed): how, and the last of its stderr.
      std::string why = w.kill_reason;
      if (why.empty()) {
        lock.unlock();
        why = w.child->end(200);
        lock.lock();
        if (options_.on_event && w.queue.empty()) options_.on_event("Python worker " + std::to_string(w.pid) + " " + why);
      }
      lost(w, why + tail_note(w.child->tail()));
    }
    return;
  }
  // Hand the reading on to the next caller waiting on this worker.
  for (auto& next : w.queue) {
    if (next->state == Pending::State::waiting) {
      next->cv.notify_one();
      break;
    }
  }
}

PythonWorkerPool::Sent PythonWorkerPool::send(const std::shared_ptr<Pending>& call, std::string_view line,
                                              std::shared_ptr<Worker>& w, std::string& why) {
  for (;;) {
    {
      std::unique_lock lock(mu_);
      for (;;) {
        if (closing_) return Sent::closed;
        std::shared_ptr<Worker> best;
        std::shared_ptr<Worker> other_idle;  // a worker of another caller's, idle
        for (const auto& candidate : workers_) {
          if (candidate->taken && candidate->caller != call->caller) {
            if (candidate->queue.empty() && !candidate->reading) other_idle = candidate;
            continue;
          }
          if (candidate->queue.size() < options_.queue_depth && (!best || candidate->queue.size() < best->queue.size()))
            best = candidate;
        }
        if (best && best->queue.empty() && !best->reading && best->child->exited()) {
          // Found ended while idle: replaced before the call, which costs it nothing.
          lost(*best, "ended while idle");
          continue;
        }
        // An idle worker first; then a new one while there may be more; then a queue.
        const bool may_start = workers_.size() + starting_ < options_.workers;
        if (best && (best->queue.empty() || !may_start)) {
          w = best;
          break;
        }
        if (may_start) {
          ++starting_;
          lock.unlock();
          std::shared_ptr<Worker> fresh;
          try {
            fresh = start();
          } catch (const HostError& e) {
            lock.lock();
            --starting_;
            changed_.notify_all();
            why = std::string("cannot start a Python worker: ") + e.what();
            return Sent::cannot_start;
          }
          lock.lock();
          --starting_;
          ++stats_.started;
          workers_.push_back(fresh);
          changed_.notify_all();
          if (closing_) {
            kill(*fresh, "the Python worker pool was closed");
            return Sent::closed;
          }
          w = fresh;
          break;
        }
        if (!best && other_idle) {
          // Every worker has served someone else: an idle one makes room for this caller's.
          kill(*other_idle, "was ended to make room for another caller's worker");
          continue;
        }
        if (changed_.wait_until(lock, Clock::time_point(std::chrono::milliseconds(call->deadline_ms))) ==
                std::cv_status::timeout &&
            steady_now_ms() >= call->deadline_ms) {
          return Sent::busy;
        }
      }
    }
    // Into its queue and onto its pipe in one order: the answers come back in it.
    std::lock_guard write_lock(w->write_mu);
    {
      std::lock_guard lock(mu_);
      if (w->dead || w->queue.size() >= options_.queue_depth) continue;  // choose again
      if (w->taken && w->caller != call->caller) continue;
      w->taken = true;
      w->caller = call->caller;
      call->state = Pending::State::waiting;
      w->queue.push_back(call);
    }
    std::size_t sent = 0;
    while (sent < line.size()) {
      const ssize_t n = write_quietly(w->child->input_fd(), line.data() + sent, line.size() - sent);
      if (n > 0) {
        sent += static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno != EAGAIN) break;  // it is gone: whoever reads it settles the call
      if (steady_now_ms() >= call->deadline_ms) {
        // Part of a line on its pipe: nothing more can be sent to it.
        std::lock_guard lock(mu_);
        kill(*w, "was killed: a request could not be written to it before its deadline");
        break;
      }
      pollfd p{w->child->input_fd(), POLLOUT, 0};
      ::poll(&p, 1, static_cast<int>(std::clamp<std::int64_t>(call->deadline_ms - steady_now_ms(), 1, 1 << 30)));
    }
    return Sent::queued;
  }
}

PythonWorkerPool::Exchange PythonWorkerPool::call(std::string_view line, const std::int64_t deadline_ms,
                                                  CancelToken* cancel, const Retire* retire, std::int64_t run_ms,
                                                  std::string_view caller) {
  auto call = std::make_shared<Pending>();
  call->deadline_ms = deadline_ms;
  call->retire = retire;
  call->caller = caller;
  if (cancel != nullptr) {
    cancel->on_cancel([this, call] { cancel_call(call); });
  }
  struct Forget {  // the token's callback goes with the call
    CancelToken* token;
    ~Forget() {
      if (token != nullptr) token->on_cancel(nullptr);
    }
  } forget{cancel};
  for (int attempt = 0;; ++attempt) {
    {
      std::lock_guard lock(mu_);
      if (call->cancelled) return {Exchange::Ending::cancelled, {}, "cancelled before it started", 0};
      call->deadline_ms = deadline_ms;
    }
    std::string why;
    std::shared_ptr<Worker> w;
    switch (send(call, line, w, why)) {
      case Sent::closed: return {Exchange::Ending::closed, {}, "the Python worker pool is closed", 0};
      case Sent::cannot_start: return {Exchange::Ending::crashed, {}, why, 0};
      case Sent::busy:
        return {Exchange::Ending::timed_out, {},
                "every Python worker (" + std::to_string(options_.workers) + ") was busy until the deadline", 0};
      case Sent::queued: break;
    }
    const std::int64_t sent_ms = steady_now_ms();
    std::unique_lock lock(mu_);
    // Its running time counts from now (the time it waited for a worker does not).
    const std::int64_t until_ms = run_ms > 0 ? std::min(deadline_ms, sent_ms + run_ms) : deadline_ms;
    call->deadline_ms = until_ms;
    if (call->cancelled && call->state == Pending::State::waiting) {  // (cancelled while it was being sent)
      lock.unlock();
      cancel_call(call);
      lock.lock();
    }
    const auto until = Clock::time_point(std::chrono::milliseconds(until_ms));
    while (call->state == Pending::State::waiting) {
      if (!w->reading && !w->settled) {
        read_for(*w, *call, lock);
        if (call->state != Pending::State::waiting) break;
      } else if (call->cv.wait_until(lock, until) != std::cv_status::timeout || call->state != Pending::State::waiting) {
        continue;
      }
      if (steady_now_ms() < until_ms) continue;
      if (!w->queue.empty() && w->queue.front() == call) {
        // Running: only killing its worker stops it.
        w->queue.pop_front();
        w->running_settled = true;
        kill(*w, "was killed at the deadline and replaced");
        return {Exchange::Ending::timed_out, {},
                "its Python worker " + std::to_string(w->pid) + " was killed and replaced" + tail_note(w->child->tail()),
                w->pid, true, until_ms < deadline_ms};
      }
      // Queued behind another call: the worker skips it, its deadline being past.
      call->state = Pending::State::abandoned;
      for (auto& next : w->queue) {  // (it may have been the one reading next)
        if (next->state == Pending::State::waiting) {
          next->cv.notify_one();
          break;
        }
      }
      return {Exchange::Ending::timed_out, {},
              "it waited behind other calls of its Python worker " + std::to_string(w->pid) + " and never started",
              w->pid};
    }
    if (call->state != Pending::State::requeue) return std::move(call->result);
    ++stats_.requeued;
    if (attempt >= kMaxRequeues) {
      return {Exchange::Ending::crashed, {},
              "its Python worker ended before the call started, " + std::to_string(attempt + 1) + " times", w->pid};
    }
  }
}

void PythonWorkerPool::cancel_call(const std::shared_ptr<Pending>& call) {
  std::lock_guard lock(mu_);
  call->cancelled = true;
  if (call->state != Pending::State::waiting) return;
  for (const auto& w : workers_) {
    auto at = std::find(w->queue.begin(), w->queue.end(), call);
    if (at == w->queue.end()) continue;
    call->state = Pending::State::failed;
    if (at == w->queue.begin()) {
      // Running: only killing its worker stops it.
      w->queue.pop_front();
      w->running_settled = true;
      call->result = {Exchange::Ending::cancelled, {}, "its Python worker " + std::to_string(w->pid) + " was killed and replaced",
                      w->pid, true};
      kill(*w, "was killed: its call was cancelled");
    } else {
      // Queued: the worker skips it.
      call->result = {Exchange::Ending::cancelled, {}, "it had not started", w->pid};
      w->queue.erase(at);
      for (auto& next : w->queue) {  // (it may have been the one reading next)
        if (next->state == Pending::State::waiting) {
          next->cv.notify_one();
          break;
        }
      }
    }
    call->cv.notify_all();
    return;
  }
  // Not sent yet: the caller sees `cancelled` before it sends.
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

PythonWorkerPool::Stats PythonWorkerPool::stats() const {
  std::lock_guard lock(mu_);
  Stats s = stats_;
  s.live = workers_.size();
  return s;
}


// --- the runner -------------------------------------------------------------------------

PythonRunner::PythonRunner(std::shared_ptr<PythonWorkerPool> pool, ToolFields fields)
    : pool_(std::move(pool)), fields_(std::move(fields)) {}

std::vector<std::string> PythonRunner::enforced_guarantees() const {
  std::vector<std::string> out;
  if (!fields_.refusal.empty() || fields_.enforcement_json.empty()) return out;
  const auto how = nlohmann::json::parse(fields_.enforcement_json, nullptr, false);
  if (!how.is_object()) return out;
  for (const auto& [name, _] : how.items()) {
    if (name == "sandbox") {
      for (const char* g : {"no_network", "no_subprocess", "no_filesystem_write"}) out.emplace_back(g);
    } else {
      out.push_back(name);
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

RunOutcome PythonRunner::run(const RunSpec& spec) {
  const auto t0 = Clock::now();
  const PythonPoolOptions& o = pool_->options();
  const std::string trace_id = spec.trace_id.empty() ? tool_protocol::new_trace_id() : std::string(spec.trace_id);
  RunOutcome out;
  auto finish = [&](std::string_view worker_trace, pid_t pid, const tool_protocol::Answer* answer) {
    spec.call.trace_json =
        make_trace(fields_, o, worker_trace, trace_id, spec.timeout_ms, millis_since(t0), pid, answer);
    return out;
  };
  if (!fields_.refusal.empty()) {
    out.ending = RunOutcome::Ending::failed;
    out.failure = ErrorKind::guarantee_blocked;
    out.detail = "guarantee_blocked: " + fields_.refusal;
    return finish({}, 0, nullptr);
  }

  std::string line;
  line.reserve(spec.input_json.size() + 256);
  tool_protocol::encode_local_call({fields_.name, fields_.entry, spec.input_json, fields_.sandbox, trace_id,
                                    fields_.capability_context_json, spec.deadline_ms},
                                   line);
  line.push_back('\n');
  PythonWorkerPool::Exchange ex = pool_->call(line, spec.deadline_ms, spec.cancel, nullptr, 0, spec.user);
  switch (ex.ending) {
    case PythonWorkerPool::Exchange::Ending::timed_out: out.ending = RunOutcome::Ending::timed_out; break;
    case PythonWorkerPool::Exchange::Ending::crashed: out.ending = RunOutcome::Ending::crashed; break;
    case PythonWorkerPool::Exchange::Ending::closed: out.ending = RunOutcome::Ending::closed; break;
    case PythonWorkerPool::Exchange::Ending::cancelled: out.ending = RunOutcome::Ending::cancelled; break;
    case PythonWorkerPool::Exchange::Ending::answered: break;
  }
  if (ex.ending != PythonWorkerPool::Exchange::Ending::answered) {
    out.detail = std::move(ex.detail);
    return finish({}, ex.pid, nullptr);
  }
  tool_protocol::Answer answer;
  std::string why;
  if (!tool_protocol::decode_answer(ex.answer, answer, why)) {
    pool_->condemn(ex.pid, "broke tool protocol v1 and was replaced");
    out.ending = RunOutcome::Ending::crashed;
    out.detail = "its Python worker " + std::to_string(ex.pid) + " broke tool protocol v1 (" + why + ") and was replaced";
    return finish({}, ex.pid, nullptr);
  }
  out.ending = RunOutcome::Ending::ran;
  out.rc = tool_protocol::apply_answer(answer, spec.call);
  return finish(answer.trace, ex.pid, &answer);
}

std::string resolve_interpreter(const std::string& python, const std::string& base_dir) {
  namespace fs = std::filesystem;
  auto usable = [](const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  if (python.find('/') != std::string::npos) {
    fs::path p(python);
    if (p.is_relative()) p = fs::path(base_dir) / p;
    const std::string path = p.lexically_normal().string();
    if (!usable(path)) throw HostError("'" + python + "' is not an executable file (" + path + ")");
    return path;
  }
  const char* env_path = std::getenv("PATH");
  const std::string dirs = env_path != nullptr && *env_path != '\0' ? env_path : "/usr/local/bin:/usr/bin:/bin";
  for (std::size_t at = 0; at <= dirs.size();) {
    const std::size_t end = std::min(dirs.find(':', at), dirs.size());
    const std::string dir = end > at ? dirs.substr(at, end - at) : ".";
    const std::string candidate = dir + "/" + python;
    if (usable(candidate)) return fs::absolute(candidate).lexically_normal().string();
    at = end + 1;
  }
  throw HostError("'" + python + "' was not found on PATH");
}

}  // namespace machina
