// Operating-system limits a worker process puts on itself before it loads any tool:
// resource limits (CPU time per call, address space, open files, file size) and the
// optional no-network filter (seccomp: no socket can be created).
#pragma once

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

/// Applies the process-wide limits (all but the per-call CPU limit) to this process.
/// Throws HostError naming the limit that could not be set.
void apply_process_limits(const WorkerLimits& limits);

/// Before each call: lets this process use at most `cpu_seconds` more CPU time (the soft
/// RLIMIT_CPU, whose SIGXCPU then ends the process). No-op for 0.
void start_cpu_budget(std::uint64_t cpu_seconds);

}  // namespace machina
