// The audit log's clocks: its ticks (the time-stamp counter where the kernel keeps time by
// it), the line that turns ticks into the steady clock, the realtime offset, and the time
// format of its records.
#include "audit_clock.hpp"

#include <machina/audit.hpp>
#include <machina/clock.hpp>

#include <time.h>

#include <climits>
#include <cstdio>
#include <cstring>

namespace machina {

namespace audit_detail {

std::int64_t realtime_minus_steady_ns() {
  timespec rt{}, mono{};
  clock_gettime(CLOCK_REALTIME, &rt);
  clock_gettime(CLOCK_MONOTONIC, &mono);
  return (static_cast<std::int64_t>(rt.tv_sec) - mono.tv_sec) * 1'000'000'000 + (rt.tv_nsec - mono.tv_nsec);
}

bool clock_runs_on_tsc() {
#if defined(__x86_64__)
  std::FILE* f = std::fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "re");
  if (f == nullptr) return false;
  char name[16] = {};
  const std::size_t n = std::fread(name, 1, sizeof name - 1, f);
  std::fclose(f);
  return n >= 4 && std::memcmp(name, "tsc\n", 4) == 0;
#else
  return false;
#endif
}

}  // namespace audit_detail

std::string audit_iso_time(std::int64_t unix_ms) {
  const time_t secs = static_cast<time_t>(unix_ms / 1000);
  tm t{};
  gmtime_r(&secs, &t);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", t.tm_year + 1900, t.tm_mon + 1, t.tm_mday,
                t.tm_hour, t.tm_min, t.tm_sec, static_cast<int>(unix_ms % 1000));
  return buf;
}

AuditLog::TickLine::TickLine(TickPoint from, TickPoint now) : to(now) {
  // (Readings without a span between them — or ticks that are nanoseconds already —:
  // a tick counts as a nanosecond.)
  if (to.ticks > from.ticks) {
    ns_per_tick = static_cast<double>(to.ns - from.ns) / static_cast<double>(to.ticks - from.ticks);
  }
}

AuditLog::TickPoint AuditLog::tick_point() const {
  if (!tsc_) {
    const std::int64_t ns = steady_now_ns();
    return {ns, ns};
  }
  // The counter read on both sides of the clock: the midpoint is as close to it as the
  // two reads are to each other — unless the thread was preempted in between, so the closest of three readings is kept
  // (one reading off by the length of a preemption would tilt the line for a whole pass).
  TickPoint best;
  std::int64_t best_gap = INT64_MAX;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const std::int64_t before = ticks();
    const std::int64_t ns = steady_now_ns();
    const std::int64_t after = ticks();
    if (after - before < best_gap) {
      best_gap = after - before;
      best = {before + (after - before) / 2, ns};
    }
  }
  return best;
}

}  // namespace machina
