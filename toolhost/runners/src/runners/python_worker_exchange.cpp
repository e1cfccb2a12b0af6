// See python_worker_pool.hpp. A call's way through the pool: sent to a worker (queued
// behind the calls it runs), its answer read by whichever caller reads that worker,
// settled at its deadline, cancelled, or sent again when its worker ended before it started.
#include "python_pool_worker.hpp"

#include <machina/clock.hpp>
#include <machina/errors.hpp>
#include <machina/runners/python_worker_pool.hpp>
#include <machina/spin_wait.hpp>

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>

namespace machina {
namespace {

using Clock = std::chrono::steady_clock;

/// How often a worker with a memory cap is looked at while it runs.
constexpr int kMemoryCheckMs = 50;
/// How often a call goes to another worker because its worker ended before it started.
constexpr int kMaxRequeues = 3;

}  // namespace

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
        call->result = {Exchange::Ending::crashed,
                        {},
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
    if (call->retire != nullptr && (*call->retire)(call->result.answer))
      retire_why = "was retired after its call";
    else if (w.queue.empty() && interpreter_threads(w) > 1)
      retire_why = "left threads running after its call";
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
        if (options_.on_event && w.queue.empty())
          options_.on_event("Python worker " + std::to_string(w.pid) + " " + why);
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
          } catch (const ConfigError& e) {
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
        return {Exchange::Ending::timed_out,
                {},
                "every Python worker (" + std::to_string(options_.workers) + ") was busy until the deadline",
                0};
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
      } else if (call->cv.wait_until(lock, until) != std::cv_status::timeout ||
                 call->state != Pending::State::waiting) {
        continue;
      }
      if (steady_now_ms() < until_ms) continue;
      if (!w->queue.empty() && w->queue.front() == call) {
        // Running: only killing its worker stops it.
        w->queue.pop_front();
        w->running_settled = true;
        kill(*w, "was killed at the deadline and replaced");
        return {
            Exchange::Ending::timed_out,
            {},
            "its Python worker " + std::to_string(w->pid) + " was killed and replaced" + tail_note(w->child->tail()),
            w->pid,
            true,
            until_ms < deadline_ms};
      }
      // Queued behind another call: the worker skips it, its deadline being past.
      call->state = Pending::State::abandoned;
      for (auto& next : w->queue) {  // (it may have been the one reading next)
        if (next->state == Pending::State::waiting) {
          next->cv.notify_one();
          break;
        }
      }
      return {Exchange::Ending::timed_out,
              {},
              "it waited behind other calls of its Python worker " + std::to_string(w->pid) + " and never started",
              w->pid};
    }
    if (call->state != Pending::State::requeue) return std::move(call->result);
    ++stats_.requeued;
    if (attempt >= kMaxRequeues) {
      return {Exchange::Ending::crashed,
              {},
              "its Python worker ended before the call started, " + std::to_string(attempt + 1) + " times",
              w->pid};
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
      call->result = {Exchange::Ending::cancelled,
                      {},
                      "its Python worker " + std::to_string(w->pid) + " was killed and replaced",
                      w->pid,
                      true};
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

}  // namespace machina
