// The command line's own options: the mode (--list, --run, --serve, --http, --nats, --mcp,
// --skill), the tools to load and the options of each front. The host's options come from
// the option table (host_option_flags.hpp).
#pragma once

#include "http_front.hpp"
#include "nats_front.hpp"

#include <CLI/CLI.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace machina::cli {

struct FrontFlags {
  std::vector<std::string> plugins;    // --plugin
  std::vector<std::string> manifests;  // --tools
  std::string packs_text;              // --packs
  std::string policy_file;             // --policy
  bool list = false;
  std::vector<std::string> run_args;    // --run [PLUGIN] AID
  std::vector<std::string> serve_args;  // --serve [PLUGIN]
  unsigned workers = 1;
  unsigned spin_us = 50;
  std::string http_address;  // --http HOST:PORT
  HttpFrontOptions http;
  std::string nats_idempotency = "local";
  std::string kv_key_file;
  NatsFrontOptions nats;
  std::size_t mcp_page_size = 100;
  bool state_per_call = false;
  bool no_audit = false;

  CLI::Option* list_opt = nullptr;
  CLI::Option* run_opt = nullptr;
  CLI::Option* serve_opt = nullptr;
  CLI::Option* http_opt = nullptr;
  CLI::Option* nats_opt = nullptr;
  CLI::Option* mcp_opt = nullptr;
  CLI::Option* skill_opt = nullptr;
  CLI::Option* no_audit_opt = nullptr;

  /// The tools, the modes and the fronts' options (the general options).
  void add(CLI::App& app);
  /// --no-audit (first of the "Audit" group).
  void add_no_audit(CLI::App& app);
  /// At most one mode.
  void exclude_modes() const;
  /// Whether a mode flag was given (--run aside: the tool_exec subcommand is --run too).
  bool any_mode_but_run() const;
};

}  // namespace machina::cli
