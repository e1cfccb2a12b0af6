// The worker side of process isolation: a machina-toolhost process started by a host
// with --isolation-worker. It limits itself, registers the host's tools, says which tools
// it has, then runs one call at a time from the host's call pipe until the host closes it.
#pragma once

#include <machina/os_limits.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace machina {
class ToolRegistry;
}

namespace machina::worker {

struct WorkerConfig {
  int call_fd = 3;                   // calls come in here (a pipe from the host)
  int result_fd = 4;                 // results go out here (a pipe to the host)
  // Registers the host's tools (the program decides how: linked in, or plugin libraries
  // loaded in the host's order). Throws HostError if it cannot.
  std::function<void(ToolRegistry&)> load_tools;
  WorkerLimits limits;
  std::size_t max_output_bytes = 0;
  std::size_t max_frame_bytes = 0;   // largest call frame accepted
  long parent_pid = 0;               // the host: if it is gone, so is this worker
};

/// Runs the worker loop; returns the process exit code (0 when the host closed the pipe).
int run_worker(const WorkerConfig& config);

}  // namespace machina::worker
