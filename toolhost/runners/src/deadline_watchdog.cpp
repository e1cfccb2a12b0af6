// See deadline_watchdog.hpp. The hot path (arm/disarm) takes one uncontended lock each
// and wakes the watchdog only when a call's deadline is earlier than the time the
// watchdog already means to look, so back-to-back calls do not wake it.
#include <machina/clock.hpp>
#include <machina/deadline_watchdog.hpp>

#include <chrono>
#include <vector>

namespace machina {

namespace {
// With nothing to watch, look again after this long: cheap, and it keeps arm() from
// having to wake the thread for every call that arrives after an idle moment.
constexpr std::int64_t kIdleLookMs = 1000;
}  // namespace

DeadlineWatchdog::~DeadlineWatchdog() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void DeadlineWatchdog::arm(Watch& w) {
  w.state_.store(Watch::armed, std::memory_order_relaxed);
  bool wake = false;
  {
    std::lock_guard lock(mu_);
    if (!started_) {
      started_ = true;
      head_.prev_ = head_.next_ = &head_;
      thread_ = std::thread([this] { run(); });
    }
    w.prev_ = head_.prev_;
    w.next_ = &head_;
    head_.prev_->next_ = &w;
    head_.prev_ = &w;
    if (w.deadline_ms < planned_wake_ms_) {
      planned_wake_ms_ = w.deadline_ms;
      wake = true;
    }
  }
  if (wake) wake_.notify_one();
}

bool DeadlineWatchdog::disarm(Watch& w) {
  int expected = Watch::armed;
  if (w.state_.compare_exchange_strong(expected, Watch::finished, std::memory_order_acq_rel)) {
    std::lock_guard lock(mu_);
    w.prev_->next_ = w.next_;
    w.next_->prev_ = w.prev_;
    return true;
  }
  // The watchdog claimed it (and unlinked it): wait until its callback is done with
  // what lives on this thread's stack.
  std::unique_lock lock(mu_);
  fired_.wait(lock, [&] { return w.state_.load(std::memory_order_acquire) == Watch::fired; });
  return false;
}

void DeadlineWatchdog::run() {
  std::vector<Watch*> due;
  std::unique_lock lock(mu_);
  while (!stopping_) {
    const std::int64_t now = steady_now_ms();
    std::int64_t earliest = INT64_MAX;
    for (Watch* w = head_.next_; w != &head_;) {
      Watch* next = w->next_;
      if (w->deadline_ms <= now) {
        int expected = Watch::armed;
        if (w->state_.compare_exchange_strong(expected, Watch::firing, std::memory_order_acq_rel)) {
          w->prev_->next_ = w->next_;
          w->next_->prev_ = w->prev_;
          due.push_back(w);
        }
      } else if (w->deadline_ms < earliest) {
        earliest = w->deadline_ms;
      }
      w = next;
    }
    planned_wake_ms_ = earliest != INT64_MAX ? earliest : now + kIdleLookMs;
    if (!due.empty()) {
      lock.unlock();
      for (Watch* w : due) w->fire(*w);
      lock.lock();
      // Under the lock, so a disarm() waiting on fired_ cannot miss it; after this, w
      // may be gone at any moment.
      for (Watch* w : due) w->state_.store(Watch::fired, std::memory_order_release);
      fired_.notify_all();
      due.clear();
      continue;  // time has passed while firing: look again before sleeping
    }
    const auto until = std::chrono::steady_clock::time_point(std::chrono::milliseconds(planned_wake_ms_));
    wake_.wait_until(lock, until);
  }
}

}  // namespace machina
