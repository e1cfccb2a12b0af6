// What the process runner (--isolation process) is given: the program its sandboxed workers
// run, how many there are, the OS limits they put on themselves and what of the host's
// environment and files they see. Plain data, shared by the host's options and the runner.
#pragma once

#include <machina/os_limits.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace machina {

struct ProcessRunnerOptions {
  std::string executable;  // machina-toolhost, started as `EXE --isolation-worker ...`
  std::size_t size = 1;    // most workers (calls running) at once
  WorkerLimits limits;
  std::vector<std::string> hidden_files;  // covered inside the sandbox (the lease key file)
  std::vector<std::string> pass_env;      // variables passed to workers besides kWorkerEnvironment
  std::size_t spares = 2;                 // call processes each worker keeps ready
  std::int64_t start_timeout_ms = 10'000;
  std::size_t stderr_tail_bytes = 2048;  // how much of a crashed call's stderr is reported
  std::size_t max_output_bytes = 0;
  std::size_t max_request_bytes = 0;
};

}  // namespace machina
