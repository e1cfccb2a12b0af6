// The worker side of process isolation: a machina-toolhost process started by a host
// with --isolation-worker. It limits itself, loads the host's plugins, says which tools
// it has, then runs one call at a time from the host's socket until the socket closes.
#pragma once

#include <machina/os_limits.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace machina::worker {

struct WorkerConfig {
  int fd = 3;                        // the host's end is the other half of this socketpair
  std::vector<std::string> plugins;  // loaded in this order, as the host did
  WorkerLimits limits;
  std::size_t max_output_bytes = 0;
  std::size_t max_frame_bytes = 0;   // largest call frame accepted
  long parent_pid = 0;               // the host: if it is gone, so is this worker
};

/// Runs the worker loop; returns the process exit code (0 when the host closed the socket).
int run_worker(const WorkerConfig& config);

}  // namespace machina::worker
