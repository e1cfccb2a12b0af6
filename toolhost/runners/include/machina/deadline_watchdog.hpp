// Deadlines for calls that run on their caller's thread: one watchdog thread per host
// that fires a callback when a call's deadline passes before the call finished. It never
// stops the stuck thread (nothing can, safely); it lets the host answer without it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace machina {

class DeadlineWatchdog {
 public:
  /// One running call. Lives on the calling thread's stack between arm() and disarm().
  struct Watch {
    std::int64_t deadline_ms = 0;    // steady clock
    void (*fire)(Watch&) = nullptr;  // on the watchdog thread, if the deadline wins
    void* context = nullptr;         // for `fire`

   private:
    friend class DeadlineWatchdog;
    enum State : int { armed, finished, firing, fired };
    std::atomic<int> state_{finished};
    Watch* prev_ = nullptr;
    Watch* next_ = nullptr;
  };

  DeadlineWatchdog() = default;
  ~DeadlineWatchdog();
  DeadlineWatchdog(const DeadlineWatchdog&) = delete;
  DeadlineWatchdog& operator=(const DeadlineWatchdog&) = delete;

  /// Starts watching `w` (deadline_ms and fire must be set).
  void arm(Watch& w);

  /// Stops watching `w`. True if the call finished before its deadline; false if the
  /// deadline fired first, in which case this returns only after `fire` has returned.
  bool disarm(Watch& w);

 private:
  void run();

  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable fired_;
  Watch head_;  // sentinel of the list of armed watches
  bool started_ = false;
  bool stopping_ = false;
  std::int64_t planned_wake_ms_ = INT64_MAX;  // when the thread means to look next
  std::thread thread_;
};

}  // namespace machina
