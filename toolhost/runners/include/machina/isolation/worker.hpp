// The worker side of process isolation: a machina-toolhost process started by a host with
// --isolation-worker. It walls itself in (see sandbox.hpp), registers the host's tools in a
// template process, says which tools it has, and keeps call processes ready: each a fresh
// copy of the template, made ahead of time, that runs exactly one call from a pipe of its
// own and ends. Nothing a call leaves behind outlives it; no call can see another's pipes.
#pragma once

#include <machina/isolation/sandbox.hpp>
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
  int control_fd = 3;  // a stream socket to the host (see worker_protocol.hpp)
  // Registers the host's tools (the program decides how: linked in, or plugin libraries
  // loaded in the host's order). Throws ConfigError if it cannot.
  std::function<void(ToolRegistry&)> load_tools;
  WorkerLimits limits;
  sandbox::Walls walls;
  std::size_t spares = 2;  // call processes kept ready
  std::size_t max_output_bytes = 0;
  std::size_t max_frame_bytes = 0;  // largest call frame accepted
  long parent_pid = 0;              // the host: if it is gone, so is this worker
};

/// Runs the worker. Returns 1 when the host is already gone; otherwise the process ends
/// in here (_exit): 0 when the host closed the socket, else as its sandbox ended.
int run_worker(const WorkerConfig& config);

}  // namespace machina::worker
