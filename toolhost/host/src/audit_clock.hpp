// The clocks the audit log reads: whether its ticks can be the time-stamp counter, and the
// offset that turns the steady clock into the realtime one.
#pragma once

#include <cstdint>

namespace machina::audit_detail {

/// The realtime clock minus the steady clock, in nanoseconds (read now).
std::int64_t realtime_minus_steady_ns();

/// Whether the kernel keeps time by the time-stamp counter: it then runs at one rate and
/// agrees across CPUs (the kernel checked), so a read of it can stand for a clock read.
bool clock_runs_on_tsc();

}  // namespace machina::audit_detail
