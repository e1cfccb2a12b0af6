// The clocks every layer reads: the monotonic clock (deadlines, breaker, idempotency), a
// cheap coarse reading of it for the hot path, and the wall clock (leases, audit dates).
// Inline: the pipeline reads the clock several times per call.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>

#include <time.h>

namespace machina {

/// Milliseconds on the monotonic clock.
inline std::int64_t steady_now_ms() noexcept {
  using namespace std::chrono;
  return duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count();
}

/// Nanoseconds on the monotonic clock.
inline std::int64_t steady_now_ns() noexcept {
  using namespace std::chrono;
  return duration_cast<nanoseconds>(steady_clock::now().time_since_epoch()).count();
}

/// Milliseconds since the epoch.
inline std::int64_t unix_now_ms() noexcept {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

/// The monotonic clock in milliseconds, cheaply, never later than steady_now_ms() (at most
/// one clock tick earlier): the coarse clock is the time of its last tick.
inline std::int64_t steady_now_ms_not_after() noexcept {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
  return static_cast<std::int64_t>(now.tv_sec) * 1000 + now.tv_nsec / 1'000'000;
}

/// The coarse clock's tick, in whole milliseconds (rounded up).
inline std::int64_t coarse_tick_ms() noexcept {
  static const std::int64_t tick_ms = [] {
    timespec res{};
    clock_getres(CLOCK_MONOTONIC_COARSE, &res);
    return static_cast<std::int64_t>(res.tv_sec) * 1000 + (res.tv_nsec + 999'999) / 1'000'000;
  }();
  return tick_ms;
}

/// A reading of steady_now_ms_not_after() made into one never earlier than steady_now_ms()
/// was at that moment (one coarse clock tick added).
inline std::int64_t not_before_from_not_after(std::int64_t not_after_ms) noexcept {
  return not_after_ms + coarse_tick_ms();
}

/// The monotonic clock in milliseconds, cheaply, never earlier than steady_now_ms() (at most
/// one clock tick later).
inline std::int64_t steady_now_ms_not_before() noexcept {
  return not_before_from_not_after(steady_now_ms_not_after());
}

/// Milliseconds elapsed on the monotonic clock since `t0`, to the microsecond (the
/// duration a call's trace reports).
inline double millis_since(std::chrono::steady_clock::time_point t0) noexcept {
  const auto elapsed = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0);
  return std::round(elapsed.count() * 1000.0) / 1000.0;
}

}  // namespace machina
