// Operating-system limits a worker process puts on itself before it loads any tool:
// resource limits (CPU time per call, address space, open files, file size) and the
// optional no-network filter (seccomp: no socket can be created).
#pragma once

#include <time.h>

#include <cstdint>
#include <string>

namespace machina {

struct WorkerLimits {
  std::uint64_t cpu_seconds = 0;       // per call; 0: none
  std::uint64_t address_space_mb = 0;  // RLIMIT_AS; 0: none
  std::uint64_t open_files = 0;        // RLIMIT_NOFILE; 0: none
  std::uint64_t file_size_mb = 0;      // RLIMIT_FSIZE; 0: none
  bool no_network = false;             // refuse socket(2) and io_uring with EACCES/EPERM

  bool any() const { return cpu_seconds || address_space_mb || open_files || file_size_mb || no_network; }
};

/// Applies the address space and file size limits and the no-network filter to this
/// process (the template of an isolated worker: every call process inherits them).
/// Throws ConfigError naming the limit that could not be set.
void apply_process_limits(const WorkerLimits& limits);

/// The open files limit, applied in each call process (the template needs descriptors of
/// its own for the call processes it keeps ready). 0: none.
void apply_open_files_limit(std::uint64_t open_files);

/// The CPU time one call may use: a timer on this process's CPU clock, armed when a call
/// starts and disarmed when it ends, that sends SIGXCPU (which ends the process) when the
/// call has used `cpu_seconds`. Not RLIMIT_CPU: that limit is checked against tick-sampled
/// time, which a tool that yields between ticks (e.g. by reading its own CPU clock in a
/// loop on a busy machine) can outrun several times over; the CPU clock is exact. The
/// soft RLIMIT_CPU is still set (to the time used so far plus the budget) so that programs
/// the tool starts inherit a limit. Does nothing for 0 seconds. Throws ConfigError if the
/// timer cannot be created.
class CpuBudget {
 public:
  explicit CpuBudget(std::uint64_t cpu_seconds);
  ~CpuBudget();
  CpuBudget(const CpuBudget&) = delete;
  CpuBudget& operator=(const CpuBudget&) = delete;

  void start();
  void stop();

 private:
  std::uint64_t seconds_;
  timer_t timer_{};
};

}  // namespace machina
