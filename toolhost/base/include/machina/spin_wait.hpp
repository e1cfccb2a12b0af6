// Bounded busy-waiting for input on a descriptor, used where a sleep and wake-up would
// cost more than the wait itself (a quick tool answered across a pipe).
#pragma once

#include <sched.h>
#include <sys/ioctl.h>

#include <chrono>

namespace machina {

/// Hint to the CPU that this thread is spinning.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/// Whether spinning can pay off for this process: only if it may run on two CPUs or more.
/// On one CPU the thread it waits for cannot run while it spins.
inline bool may_run_on_two_cpus() noexcept {
  cpu_set_t set;
  return sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) >= 2;
}

/// Polls `fd` until it has bytes to read, for at most `limit`. True if bytes came; false
/// if the time ran out or the descriptor cannot say (then the caller blocks as usual).
inline bool spin_until_readable(int fd, std::chrono::microseconds limit) noexcept {
  if (limit.count() <= 0) return false;
  const auto until = std::chrono::steady_clock::now() + limit;
  for (;;) {
    int available = 0;
    if (::ioctl(fd, FIONREAD, &available) != 0) return false;
    if (available > 0) return true;
    if (std::chrono::steady_clock::now() >= until) return false;
    cpu_relax();
  }
}

}  // namespace machina
