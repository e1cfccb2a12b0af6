// The worker side of --isolation process: machina-toolhost started by the host itself as
// `EXE --isolation-worker ...` (machina/isolation/worker_flags.hpp), not by people.
// Compiled into each build (the tools linked in differ).
#pragma once

#include <machina/host_options.hpp>

#include <CLI/CLI.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace machina::cli {

struct WorkerFlags {
  bool worker_mode = false;
  bool with_linked_tools = false;  // register the tools linked into this program
  long parent_pid = 0;
  std::size_t spares = 2;
  std::vector<std::string> hidden_files;

  /// The hidden flags (the host options the worker also reads are the table's).
  void add(CLI::App& app);
  /// Runs the worker with the plugins named and the host's options; returns the exit code.
  int run(const std::vector<std::string>& plugins, const HostOptions& options) const;
};

}  // namespace machina::cli
