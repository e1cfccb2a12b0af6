// machina-toolhost's command line: every flag (the fronts', the host option table's, the
// worker's hidden ones), the subcommands, --help's footer, and the Invocation the flags
// given make. Compiled into each build (the --help footer finds the installed docs).
#pragma once

#include "front_flags.hpp"
#include "host_option_flags.hpp"
#include "invocation.hpp"
#include "subcommands.hpp"
#include "worker_main.hpp"

#include <machina/host_options.hpp>

#include <CLI/CLI.hpp>

#include <optional>

namespace machina::cli {

class CommandLine {
 public:
  CommandLine();

  /// Parses; an exit code when there is nothing more to do (--help, --version, an error
  /// said on stderr), else nullopt.
  std::optional<int> parse(int argc, char** argv);

  /// The plugins named (--plugin, or a PLUGIN argument of --run, --serve or tool_exec).
  const std::vector<std::string>& plugins() const { return front_.plugins; }
  bool manifests_named() const { return !front_.manifests.empty(); }
  bool nats_named() const { return front_.nats_opt->count() > 0; }
  bool worker_mode() const { return worker_.worker_mode; }
  bool operator_command() const { return subcommands_.operator_command(); }

  /// Runs the isolated worker the hidden flags describe.
  int run_worker() const { return worker_.run(front_.plugins, options_); }
  /// Completes the host's options from the flags (per-tool deadlines, the worker counts,
  /// the audit store). Throws ConfigError.
  void finish_host_options();
  /// Runs `lease issue` or `audit report`; returns the exit code. Throws ConfigError.
  int run_operator_command() { return subcommands_.run_operator_command(options_.audit.db_path); }
  /// The invocation the flags ask for, or nullopt when no mode is given (said on stderr).
  /// Throws ConfigError for a front's options that cannot be served.
  std::optional<Invocation> invocation();

 private:
  CLI::App app_;
  FrontFlags front_;
  HostOptions options_;
  HostOptionFlags host_flags_;
  WorkerFlags worker_;
  Subcommands subcommands_;
  bool run_mode_ = false;
};

}  // namespace machina::cli
