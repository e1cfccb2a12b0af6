// DeadlineWatchdog: a watch whose deadline passes fires once, on the watchdog's thread, and
// disarm() returns only after the callback is done; a watch disarmed first never fires; a
// watch armed with an earlier deadline than the watchdog means to look at wakes it.
#include <machina/clock.hpp>
#include <machina/deadline_watchdog.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

using namespace machina;

namespace {

struct Fired {
  std::mutex mu;
  std::vector<int> order;  // the tags of the watches that fired, in firing order
  std::atomic<int> count{0};
  std::thread::id thread;  // the thread the callbacks ran on
};

struct Tagged {
  DeadlineWatchdog::Watch watch;
  Fired* fired = nullptr;
  int tag = 0;
  std::atomic<bool> callback_started{false};
  std::atomic<bool> callback_done{false};
};

void record(DeadlineWatchdog::Watch& w) {
  Tagged& t = *static_cast<Tagged*>(w.context);
  t.callback_started.store(true);
  // Long enough that a disarm() that did not wait for the callback would return first.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  {
    std::lock_guard lock(t.fired->mu);
    t.fired->order.push_back(t.tag);
    t.fired->thread = std::this_thread::get_id();
  }
  t.fired->count.fetch_add(1);
  t.callback_done.store(true);
}

void arm(DeadlineWatchdog& dog, Tagged& t, Fired& fired, int tag, std::int64_t deadline_ms) {
  t.fired = &fired;
  t.tag = tag;
  t.watch.deadline_ms = deadline_ms;
  t.watch.fire = &record;
  t.watch.context = &t;
  dog.arm(t.watch);
}

/// Waits (at most 10 s: a guard against a watchdog that never fires) until `n` watches fired.
bool wait_for_fired(const Fired& fired, int n) {
  const std::int64_t give_up = steady_now_ms() + 10'000;
  while (fired.count.load() < n && steady_now_ms() < give_up) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return fired.count.load() >= n;
}

}  // namespace

TEST_CASE("a watch past its deadline fires once on the watchdog's thread, disarm waits for it") {
  DeadlineWatchdog dog;
  Fired fired;
  Tagged t;
  arm(dog, t, fired, 1, steady_now_ms() + 20);
  REQUIRE(wait_for_fired(fired, 1));
  CHECK_FALSE(dog.disarm(t.watch));
  CHECK(t.callback_done.load());
  CHECK(fired.count.load() == 1);
  CHECK(fired.thread != std::this_thread::get_id());
}

TEST_CASE("disarm() while the callback runs returns only after it is done") {
  DeadlineWatchdog dog;
  Fired fired;
  Tagged t;
  arm(dog, t, fired, 1, steady_now_ms());
  const std::int64_t give_up = steady_now_ms() + 10'000;
  while (!t.callback_started.load() && steady_now_ms() < give_up) std::this_thread::yield();
  REQUIRE(t.callback_started.load());
  CHECK_FALSE(dog.disarm(t.watch));
  CHECK(t.callback_done.load());
}

TEST_CASE("a watch disarmed before its deadline never fires") {
  DeadlineWatchdog dog;
  Fired fired;
  Tagged early, late;
  arm(dog, early, fired, 1, steady_now_ms() + 60'000);
  CHECK(dog.disarm(early.watch));
  // A later watch that does fire shows the watchdog ran past the first one's place.
  arm(dog, late, fired, 2, steady_now_ms() + 10);
  REQUIRE(wait_for_fired(fired, 1));
  CHECK_FALSE(dog.disarm(late.watch));
  std::lock_guard lock(fired.mu);
  CHECK(fired.order == std::vector<int>{2});
}

TEST_CASE("an earlier deadline armed after a later one wakes the watchdog for it") {
  DeadlineWatchdog dog;
  Fired fired;
  Tagged far, near;
  arm(dog, far, fired, 1, steady_now_ms() + 60'000);  // the watchdog means to look in a minute
  arm(dog, near, fired, 2, steady_now_ms() + 20);
  REQUIRE(wait_for_fired(fired, 1));  // within 10 s, not the minute
  CHECK_FALSE(dog.disarm(near.watch));
  CHECK(dog.disarm(far.watch));
  std::lock_guard lock(fired.mu);
  CHECK(fired.order == std::vector<int>{2});
}
