// A mutex for short critical sections on a hot path: taking and giving it back when no
// other thread wants it is one atomic instruction each, inline (std::mutex goes through
// two calls into the C library, too many for the idempotency cache's hot path). A
// thread that finds it taken spins briefly (if the process may use two CPUs), then sleeps
// on the word (a futex, through C++20 atomic wait) until the holder wakes it. Not fair: a
// spinning thread may take it before one just woken, which short sections can afford.
#pragma once

#include <machina/spin_wait.hpp>

#include <atomic>

namespace machina {

class LightMutex {
 public:
  LightMutex() = default;
  LightMutex(const LightMutex&) = delete;
  LightMutex& operator=(const LightMutex&) = delete;

  void lock() noexcept {
    int seen = kFree;
    if (state_.compare_exchange_strong(seen, kHeld, std::memory_order_acquire, std::memory_order_relaxed)) return;
    lock_contended();
  }
  bool try_lock() noexcept {
    int seen = kFree;
    return state_.compare_exchange_strong(seen, kHeld, std::memory_order_acquire, std::memory_order_relaxed);
  }
  void unlock() noexcept {
    if (state_.exchange(kFree, std::memory_order_release) == kWaited) state_.notify_one();
  }

 private:
  static constexpr int kFree = 0, kHeld = 1, kWaited = 2;  // kWaited: held, and a thread may sleep on it

  void lock_contended() noexcept {
    // (on one CPU the holder cannot run while this thread spins)
    static const int kSpins = may_run_on_two_cpus() ? 100 : 0;
    for (int spins = 0; spins < kSpins; ++spins) {
      cpu_relax();
      int seen = kFree;
      if (state_.load(std::memory_order_relaxed) == kFree &&
          state_.compare_exchange_weak(seen, kHeld, std::memory_order_acquire, std::memory_order_relaxed)) {
        return;
      }
    }
    // From here on the word says someone waits, so that the holder's unlock wakes one.
    while (state_.exchange(kWaited, std::memory_order_acquire) != kFree)
      state_.wait(kWaited, std::memory_order_relaxed);
  }

  std::atomic<int> state_{kFree};
};

}  // namespace machina
