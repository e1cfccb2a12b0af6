// machina-toolhost's command line and the Invocation it makes.
#include "command_line.hpp"

#include "default_audit.hpp"
#include "package_paths.hpp"
#include "say.hpp"
#ifdef MACHINA_WITH_NATS
#include "nats_kv_store.hpp"
#endif

#include <machina/nearest_name.hpp>

#include <cstdlib>
#include <filesystem>
#include <sstream>

#ifndef MACHINA_VERSION
#error "MACHINA_VERSION must be defined by the build"
#endif

namespace fs = std::filesystem;

namespace machina::cli {

namespace {

/// "Did you mean …?" for each argument among `unknown` that looks like a misspelt option.
void suggest_options(const CLI::App& app, const std::vector<std::string>& unknown) {
  std::vector<std::string> names;
  for (const CLI::Option* o : app.get_options()) {
    for (const std::string& n : o->get_lnames()) names.push_back("--" + n);
  }
  const std::vector<std::string_view> views(names.begin(), names.end());
  for (const std::string& arg : unknown) {
    if (!arg.starts_with("--")) continue;
    const std::string flag = arg.substr(0, arg.find('='));
    if (const std::string near = nearest_name(flag, views); !near.empty())
      say(flag + " is not an option; did you mean " + near + "?");
  }
}

std::string help_footer() {
  // The docs/*.md files the options name, as installed with the package (or in the source).
  std::string docs = "the docs/ folder of the project's source";
  try {
    docs = fs::path(find_package_file("docs/protocol.md", "the documentation", "")).parent_path().string();
  } catch (const ConfigError&) {
  }
  return std::string(
             "Environment: MACHINA_LEASE_ENFORCE=1 (tools of tier > 0 need a lease), MACHINA_LEASE_SECRET /\n"
             "MACHINA_LEASE_KEY_FILE (the lease secret, read once at start: MACHINA_LEASE_SECRET is then taken out "
             "of\n"
             "the environment, and the key file must lie outside the workspace), MACHINA_LEASE_LEDGER (directory "
             "that\n"
             "makes single use hold across processes), MACHINA_TOOLHOST_PLUGIN_DIR (load the built-in tools from\n"
             "machina_builtin_tools.so in this directory), MACHINA_TOOLHOST_WORKSPACE (the file tools' folder),\n"
             "MACHINA_TOOLHOST_POLICY (the tool packs' policy file), MACHINA_TOOLHOST_AUDIT_DB and\n"
             "MACHINA_TOOLHOST_AUDIT_JSONL (the audit store, as --audit-db and --audit-jsonl), "
             "MACHINA_TOOLHOST_AUDIT=0\n"
             "(no default audit store, as --no-audit), XDG_STATE_HOME (where the default audit store is).\n"
             "Documentation: the docs/*.md files named above (docs/protocol.md: the request and response lines) are "
             "in ") +
         docs;
}

}  // namespace

CommandLine::CommandLine()
    : app_("machina-toolhost " MACHINA_VERSION
           " - runs tools for AI agents: one request in, one structured\n"
           "response out, with input caps, idempotency, leases and a circuit breaker.\n"
           "Without --plugin (or a PLUGIN argument) the built-in tools are loaded.",
           "machina-toolhost"),
      options_(HostOptions::from_env()) {
  app_.set_version_flag("--version", MACHINA_VERSION);
  front_.add(app_);
  host_flags_.add(app_, options_, "");
  host_flags_.add(app_, options_, "Deadlines and isolation");
  front_.add_no_audit(app_);
  host_flags_.add(app_, options_, "Audit");
  app_.get_option("--audit-db")->excludes(front_.no_audit_opt);
  app_.get_option("--audit-jsonl")->excludes(front_.no_audit_opt);
  worker_.add(app_);
  front_.exclude_modes();
  subcommands_.add(app_);
  app_.footer(help_footer);
}

std::optional<int> CommandLine::parse(int argc, char** argv) {
  try {
    app_.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app_.exit(e);
    if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) suggest_options(app_, app_.remaining());
    return rc == 0 ? 0 : 2;
  }
  if (*subcommands_.tool_exec) {
    if (front_.run_opt->count() > 0 || front_.any_mode_but_run()) {
      say("tool_exec runs one call, as --run: it takes none of --run, --list, --serve, --http, --mcp, --skill, "
          "--nats");
      return 2;
    }
    front_.run_args = subcommands_.tool_exec_args;
  }
  run_mode_ = front_.run_opt->count() > 0 || *subcommands_.tool_exec;
  if (front_.run_args.size() == 2) front_.plugins.push_back(front_.run_args[0]);
  if (front_.serve_args.size() == 1 && !front_.serve_args[0].empty()) front_.plugins.push_back(front_.serve_args[0]);
  return std::nullopt;
}

void CommandLine::finish_host_options() {
  host_flags_.finish(options_);
  set_up_for_this_program(options_);
  if (options_.isolation == Isolation::process && app_.get_option("--isolation-workers")->count() == 0) {
    options_.workers.size = front_.workers;
  }
  if (app_.get_option("--python-workers")->count() == 0) options_.python_workers = front_.workers;
  if (!*subcommands_.lease_issue) {
    default_audit(options_.audit, run_mode_, front_.no_audit, app_.get_option("--audit-required")->count() > 0);
  }
}

std::optional<Invocation> CommandLine::invocation() {
  FrontFlags& f = front_;
  if (!f.any_mode_but_run() && !run_mode_) {
    say("choose one of --list, --run, --serve, --http, --mcp, --skill, --nats (see --help)");
    return std::nullopt;
  }
  Invocation inv;
  using Mode = Invocation::Mode;
  inv.mode = f.list                     ? Mode::list
             : run_mode_                ? Mode::run
             : f.http_opt->count() > 0  ? Mode::http
             : f.mcp_opt->count() > 0   ? Mode::mcp
             : f.skill_opt->count() > 0 ? Mode::skill
             : f.nats_opt->count() > 0  ? Mode::nats
                                        : Mode::serve;
  // The JSON-RPC fronts read on while calls run (a cancellation must reach them); NATS
  // requests arrive from many callers at once.
  if ((inv.mode == Mode::mcp || inv.mode == Mode::skill || inv.mode == Mode::nats) &&
      app_.get_option("--workers")->count() == 0) {
    f.workers = 32;
  }
  if (inv.mode == Mode::http) {
    const std::string& address = f.http_address;
    const auto colon = address.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == address.size())
      throw ConfigError("--http " + address + ": expected HOST:PORT");
    inv.http = f.http;
    inv.http.mcp_page_size = f.mcp_page_size;
    inv.http.host = address.substr(0, colon);
    if (inv.http.host.size() > 2 && inv.http.host.front() == '[' && inv.http.host.back() == ']')
      inv.http.host = inv.http.host.substr(1, inv.http.host.size() - 2);
    inv.http.port = address.substr(colon + 1);
    std::int64_t port = 0;
    if (inv.http.port != "0" && (!parse_positive(inv.http.port, port) || port > 65535))
      throw ConfigError("--http " + address + ": the port must be 0..65535");
    // The token stays in this process only: no tool inherits it.
    if (const char* token = std::getenv("MACHINA_TOOLHOST_HTTP_TOKEN"); token != nullptr && *token != '\0') {
      inv.http.token = token;
      ::unsetenv("MACHINA_TOOLHOST_HTTP_TOKEN");
    }
    check_http_front_options(inv.http);  // before any tool is loaded
  }
  if (inv.mode == Mode::nats) {
    inv.nats = f.nats;
    inv.nats.workers = f.workers;
    inv.nats.shared_store = f.nats_idempotency == "kv";
#ifdef MACHINA_WITH_NATS
    if (inv.nats.shared_store) {
      if (f.kv_key_file.empty())
        throw ConfigError(
            "--nats-idempotency kv needs --kv-key-file FILE: the key (at least 32 bytes) the "
            "group's hosts sign the shared store's entries with");
      inv.nats.kv_key = load_kv_key(f.kv_key_file);
    }
    check_nats_front_options(inv.nats);  // before any tool is loaded
#endif
  }
  inv.plugins = f.plugins;
  inv.manifests = f.manifests;
  if (app_.get_option("--packs")->count() > 0) {
    std::vector<std::string> names;
    std::stringstream in(f.packs_text);
    for (std::string name; std::getline(in, name, ',');) {
      if (!name.empty()) names.push_back(name);
    }
    if (names.empty()) throw ConfigError("--packs: name at least one pack (files, shell, code, python) or none");
    inv.packs = names;
  }
  inv.policy_file = f.policy_file;
  if (!f.run_args.empty()) inv.aid = f.run_args.back();
  inv.workers = f.workers;
  inv.mcp_page_size = f.mcp_page_size;
  inv.spin_us = f.spin_us;
  inv.state_per_call = f.state_per_call;
  inv.options = std::move(options_);
  return inv;
}

}  // namespace machina::cli
