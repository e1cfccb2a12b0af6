// LightMutex: mutual exclusion under contention, and a thread that sleeps on it is woken.
#include <machina/light_mutex.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

using namespace machina;

TEST_CASE("LightMutex: four threads contending lose no update") {
  LightMutex mu;
  long counter = 0;  // not atomic: only the mutex protects it
  std::atomic<int> inside{0}, most_inside{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 100'000; ++i) {
        std::lock_guard lock(mu);
        const int now = ++inside;
        if (now > most_inside.load()) most_inside.store(now);
        ++counter;
        --inside;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(counter == 400'000);
  CHECK(most_inside.load() == 1);
}

TEST_CASE("LightMutex: a thread that waits past its spinning sleeps, and the unlock wakes it") {
  LightMutex mu;
  mu.lock();
  std::atomic<bool> got{false};
  std::thread other([&] {
    std::lock_guard lock(mu);
    got = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // far past the spinning: asleep
  CHECK_FALSE(got.load());
  CHECK_FALSE(mu.try_lock());
  const auto released = std::chrono::steady_clock::now();
  mu.unlock();
  other.join();
  CHECK(got.load());
  CHECK(std::chrono::steady_clock::now() - released < std::chrono::seconds(1));
  CHECK(mu.try_lock());  // free again
  mu.unlock();
}

TEST_CASE("LightMutex: a condition_variable_any waits and is notified through it") {
  LightMutex mu;
  std::condition_variable_any cv;
  bool ready = false;
  bool saw_ready = false;  // set by the waiter, under the lock, once its wait returned
  std::thread waiter([&] {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return ready; });
    saw_ready = ready;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  {
    std::lock_guard lock(mu);
    ready = true;
  }
  cv.notify_all();
  waiter.join();
  CHECK(saw_ready);
  CHECK(mu.try_lock());  // the waiter gave the lock back
  mu.unlock();
}
