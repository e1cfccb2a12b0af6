// machina-toolhost: the command-line fronts (--list, --run, --serve, --http, --mcp, --skill,
// --nats), the operator's subcommands, the isolated worker and the sandbox launcher. Picks
// what this start is, hands over to another build where this one cannot serve it, and runs it.
#include "command_line.hpp"
#include "default_audit.hpp"
#include "invocation.hpp"
#include "package_paths.hpp"
#include "say.hpp"

#include <machina/http_client.hpp>
#include <machina/isolation/sandbox_exec.hpp>

#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <string>

namespace {

using machina::cli::Invocation;

/// `--run AID` and `--run PLUGIN AID` with nothing else are most of what spawning clients
/// send: these two shapes are recognised directly, without building the full parser, and
/// mean exactly what the parser would make of them.
bool fast_run(int argc, char** argv, Invocation& inv) {
  if (argc < 3 || argc > 4 || std::strcmp(argv[1], "--run") != 0) return false;
  for (int i = 2; i < argc; ++i) {
    if (argv[i][0] == '-' || argv[i][0] == '\0') return false;
  }
  inv.mode = Invocation::Mode::run;
  if (argc == 4) inv.plugins.emplace_back(argv[2]);
  inv.aid = argv[argc - 1];
  inv.options = machina::HostOptions::from_env();
  machina::cli::default_audit(inv.options.audit, /*run=*/true, /*off=*/false, /*required_named=*/false);
  machina::cli::set_up_for_this_program(inv.options);
  return true;
}

int say_config_error(const machina::ConfigError& e) {
  machina::cli::say(e.what());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  // The launcher of a confined program (a sandboxed Python tool worker), started by the
  // host itself: `--sandbox-exec SPEC -- PROGRAM ARGS...` (isolation/sandbox_exec.hpp).
  if (argc >= 5 && std::strcmp(argv[1], "--sandbox-exec") == 0 && std::strcmp(argv[3], "--") == 0) {
    try {
      return machina::sandbox::exec_in_sandbox(machina::sandbox::ExecSpec::from_json(argv[2]), argv + 4);
    } catch (const machina::ConfigError& e) {
      const std::string text = std::string("machina-toolhost sandbox: ") + e.what() + "\n";
      (void)!::write(STDERR_FILENO, text.data(), text.size());
      return 126;
    }
  }
  signal(SIGPIPE, SIG_IGN);  // a vanished reader is seen as a failed write
#ifndef MACHINA_LINKED_TOOLS
  machina::http::use_system_resolver();  // (the static build hands tool manifests over to this one)
  machina::http::use_tls();              // (https tool services)
#endif

  if (Invocation fast; fast_run(argc, argv, fast)) {
#ifdef MACHINA_LINKED_TOOLS
    if (machina::cli::needs_plugin_loader(!fast.plugins.empty())) machina::cli::hand_over_to_plugin_loader(argv);
#endif
    try {
      return machina::cli::execute(fast);
    } catch (const machina::ConfigError& e) {
      return say_config_error(e);
    }
  }

  machina::cli::CommandLine command_line;
  if (const auto rc = command_line.parse(argc, argv)) return *rc;
#ifndef MACHINA_WITH_NATS
  if (!command_line.operator_command() && command_line.nats_named()) machina::cli::hand_over_to_nats_build(argv);
#endif
#ifdef MACHINA_LINKED_TOOLS
  // Tool manifests too: their HTTP services' host names need the C library's resolver.
  if (!command_line.operator_command() &&
      machina::cli::needs_plugin_loader(!command_line.plugins().empty() || command_line.manifests_named())) {
    machina::cli::hand_over_to_plugin_loader(argv);
  }
#endif
  if (command_line.worker_mode()) return command_line.run_worker();

  try {
    command_line.finish_host_options();
    if (command_line.operator_command()) return command_line.run_operator_command();
    auto inv = command_line.invocation();
    if (!inv) return 2;
    return machina::cli::execute(*inv);
  } catch (const machina::ConfigError& e) {
    return say_config_error(e);
  }
}
