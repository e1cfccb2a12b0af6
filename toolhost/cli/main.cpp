// machina-toolhost: the command-line fronts (--list, --run, --serve, --http, --mcp, --skill,
// --nats) and the
// operator's `lease issue`. Parses arguments, sets up the host, hands over to a front.
#include "codecs/jsonrpc_codec.hpp"
#include "codecs/ndjson_codec.hpp"
#include "http_front.hpp"
#include "nats_front.hpp"
#ifdef MACHINA_WITH_NATS
#include "nats_kv_store.hpp"
#endif
#include "serve_kit.hpp"

#include <machina/host.hpp>
#include <machina/http_client.hpp>
#include <machina/lease.hpp>
#include <machina/nearest_name.hpp>
#include <machina/policy.hpp>
#include <machina/spin_wait.hpp>
#include <machina/tool_list.hpp>

#include <machina/isolation/sandbox_exec.hpp>
#include <machina/isolation/worker.hpp>
#include <nlohmann/json.hpp>

#include <CLI/CLI.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#ifndef MACHINA_VERSION
#error "MACHINA_VERSION must be defined by the build"
#endif
#ifndef MACHINA_PACKAGE_RELDIRS
#define MACHINA_PACKAGE_RELDIRS ""
#endif

namespace fs = std::filesystem;

#ifdef MACHINA_LINKED_TOOLS
// This build has the built-in pack (plugins/builtin/builtin_tools.cpp) linked in and is
// linked fully statically: starting it costs about what starting /bin/true does. It
// cannot load plugin libraries; for those it hands over to the plugin-loading build.
extern "C" std::uint32_t machina_plugin_abi_version(void);
extern "C" int machina_plugin_register(const machina_registrar_api* api, machina_registrar* registrar);
#endif

namespace {

/// Where a file of the installed machina_dispatch package (or of the build tree) is, given
/// its path inside the package: next to the Python package (found relative to this
/// executable), else relative to the executable as laid out in the build tree. Throws
/// HostError listing the places looked at, with `hint`.
std::string find_package_file(const std::string& inside, const std::string& what, const std::string& hint) {
  // Plain strings and access(2): the first candidate (this interpreter's default install
  // scheme) is nearly always the one.
  std::vector<std::string> tried;
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    std::string exe_dir(exe, static_cast<std::size_t>(n));
    exe_dir.resize(exe_dir.rfind('/') + 1);
    // The plugin-loading build lives in the package's (or build tree's) libexec/, the build
    // that serves NATS in libexec/nats/.
    if (exe_dir.size() > 9 && exe_dir.ends_with("/libexec/")) tried.push_back(exe_dir + "../" + inside);
    if (exe_dir.size() > 14 && exe_dir.ends_with("/libexec/nats/")) tried.push_back(exe_dir + "../../" + inside);
    const std::string_view reldirs = MACHINA_PACKAGE_RELDIRS;
    for (std::size_t at = 0; at <= reldirs.size();) {
      const std::size_t end = std::min(reldirs.find(':', at), reldirs.size());
      if (end > at) tried.push_back(exe_dir + std::string(reldirs.substr(at, end - at)) + "/" + inside);
      at = end + 1;
    }
    tried.push_back(exe_dir + inside);
  }
  for (const auto& p : tried) {
    if (::access(p.c_str(), R_OK) == 0) return fs::path(p).lexically_normal().string();
  }
  std::string where;
  for (const auto& p : tried) where += "\n  " + fs::path(p).lexically_normal().string();
  throw machina::HostError(what + " not found; looked for:" + where + "\n" + hint);
}

const char* builtin_plugin_dir() {
  const char* dir = std::getenv("MACHINA_TOOLHOST_PLUGIN_DIR");
  return dir != nullptr && *dir != '\0' ? dir : nullptr;
}

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
    if (const std::string near = machina::nearest_name(flag, views); !near.empty())
      std::cerr << "machina-toolhost: " << flag << " is not an option; did you mean " << near << "?\n";
  }
}

#if defined(MACHINA_LINKED_TOOLS) || !defined(MACHINA_WITH_NATS)
/// Runs the build of this program found at `inside` the package (see find_package_file) in
/// this process's place with the same arguments; `purpose` words what for, on failure.
[[noreturn]] void hand_over(char** argv, const std::string& inside, const std::string& what,
                            const std::string& purpose) {
  std::string build;
  try {
    build = find_package_file(inside, what, "it is installed with the machina_dispatch package; reinstall it");
  } catch (const machina::HostError& e) {
    const std::string text = "machina-toolhost: cannot " + purpose + ": " + e.what() + "\n";
    (void)!::write(STDERR_FILENO, text.data(), text.size());
    _exit(2);
  }
  ::execv(build.c_str(), argv);
  const std::string text = "machina-toolhost: cannot start " + build + ": " + std::strerror(errno) + "\n";
  (void)!::write(STDERR_FILENO, text.data(), text.size());
  _exit(2);
}
#endif

#ifndef MACHINA_WITH_NATS
/// --nats is served by the build of this program linked with the NATS client (a shared
/// library, which the other builds do not load at every start), in the package's
/// libexec/nats/.
[[noreturn]] void hand_over_to_nats_build(char** argv) {
  hand_over(argv, "libexec/nats/machina-toolhost", "the build of machina-toolhost that serves NATS", "serve NATS");
}
#endif

#ifdef MACHINA_LINKED_TOOLS
constexpr machina::PluginEntryPoints kLinkedTools{&machina_plugin_abi_version, &machina_plugin_register};

/// Plugin libraries (named, or the built-in pack from MACHINA_TOOLHOST_PLUGIN_DIR) are
/// loaded by the dynamically linked build of this program, installed in the package's
/// libexec/: it is run in this process's place with the same arguments.
bool needs_plugin_loader(bool plugins_named) {
  return plugins_named || builtin_plugin_dir() != nullptr;
}

[[noreturn]] void hand_over_to_plugin_loader(char** argv) {
  hand_over(argv, "libexec/machina-toolhost", "the plugin-loading build of machina-toolhost", "load plugins");
}
#else
/// The built-in plugin pack: $MACHINA_TOOLHOST_PLUGIN_DIR, else in the installed Python
/// package (relative to this executable), else in the build tree.
std::string find_builtin_plugin() {
  const std::string file(machina::kBuiltinPluginFile);
  if (const char* dir = builtin_plugin_dir()) return (fs::path(dir) / file).string();
  return find_package_file("plugins/" + file, "built-in plugins",
                           "set MACHINA_TOOLHOST_PLUGIN_DIR or name a plugin with --plugin");
}
#endif

/// Registers the tools of this invocation: the plugins named, else the built-in plugin;
/// the tool packs (all of them when no plugin is named, else those --packs names); then
/// the tools of the manifests named.
void load_tools(machina::Host& host, const std::vector<std::string>& plugins, const std::vector<std::string>& manifests,
                const std::optional<std::vector<std::string>>& packs, const std::string& policy_file) {
  if (packs ? !(packs->size() == 1 && packs->front() == "none") : plugins.empty()) {
    machina::Policy policy = policy_file.empty() ? machina::policy_from_env() : machina::load_policy(policy_file, [] {
      const char* ws = std::getenv("MACHINA_TOOLHOST_WORKSPACE");
      return std::string(ws != nullptr ? ws : "");
    }());
    host.add_packs(packs ? *packs : std::vector<std::string>{}, std::move(policy));
  }
#ifdef MACHINA_LINKED_TOOLS
  (void)plugins;  // with plugins named, main() has handed over to the plugin loader
  host.add_linked_plugin(kLinkedTools);
#else
  if (plugins.empty()) host.load_plugin(find_builtin_plugin());
  for (const auto& p : plugins) host.load_plugin(p);
#endif
  for (const auto& m : manifests) host.load_tools(m);
}

bool parse_positive(const std::string& text, std::int64_t& out) {
  if (text.empty() || text.size() > 9) return false;
  out = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    out = out * 10 + (c - '0');
  }
  return out > 0;
}

/// stdout belongs to the protocol: keep the real stdout as the wire and point fd 1 at
/// stderr, so nothing a plugin prints can reach the stream.
int take_stdout_for_wire() {
  const int wire = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
  if (wire < 0 || dup2(STDERR_FILENO, STDOUT_FILENO) < 0) throw machina::HostError("cannot set up the output stream");
  return wire;
}

/// What to do once the command line is understood.
struct Invocation {
  enum class Mode { list, run, serve, http, mcp, skill, nats } mode = Mode::serve;
  std::vector<std::string> plugins;               // empty: the built-in pack
  std::vector<std::string> manifests;             // --tools
  std::optional<std::vector<std::string>> packs;  // --packs (unset: all when no plugin is named)
  std::string policy_file;                        // --policy ("": $MACHINA_TOOLHOST_POLICY or the defaults)
  std::string aid;                                // --run
  unsigned workers = 1;                           // --serve
  std::size_t mcp_page_size = 100;                // --mcp
  unsigned spin_us = 0;                           // --serve
  bool state_per_call = false;                    // --serve
  machina::cli::HttpFrontOptions http;            // --http
  machina::cli::NatsFrontOptions nats;            // --nats
  machina::HostOptions options;
};

void report_events(machina::HostOptions& options) {
  options.on_event = [](std::string_view line) {
    std::string text = "machina-toolhost: " + std::string(line) + "\n";
    (void)!::write(STDERR_FILENO, text.data(), text.size());
  };
}

int execute(Invocation& inv) {
  // Out of the environment (and /proc/self/environ) before any plugin code runs (loading
  // included); the host still has it. (After any hand-over to the plugin loader, which
  // needs it in its environment.)
  machina::protect_lease_secret(/*unset=*/true);
  // Before any plugin code runs, so nothing it prints reaches the wire.
  const int wire = take_stdout_for_wire();
  // With isolated tools, no process of this user may open this one's /proc files (its
  // descriptors, its memory) or trace it; the sandbox already hides it from them.
  if (inv.options.isolation == machina::Isolation::process) prctl(PR_SET_DUMPABLE, 0);
  machina::Host host(inv.options);
  load_tools(host, inv.plugins, inv.manifests, inv.packs, inv.policy_file);

  if (inv.mode == Invocation::Mode::list) {
    return machina::cli::write_all(wire, "{\"ok\":true,\"tools\":" + machina::tool_list_json(host) + "}\n") ? 0 : 1;
  }
  if (inv.mode == Invocation::Mode::run) {
    const int rc = machina::cli::run_once(host, inv.aid, STDIN_FILENO, wire);
    // The one response is written: tearing the host down (registry, schemas, plugins)
    // would only cost time. Worker processes are stopped properly.
    if (inv.options.isolation == machina::Isolation::inline_threads) {
      host.flush_audit();
      _exit(rc);
    }
    return rc;
  }
  if (inv.mode == Invocation::Mode::http || inv.mode == Invocation::Mode::nats) {
#ifdef MACHINA_WITH_NATS
    const int rc = inv.mode == Invocation::Mode::http ? machina::cli::serve_http(host, inv.http)
                                                      : machina::cli::serve_nats(host, inv.nats);
#else
    const int rc = machina::cli::serve_http(host, inv.http);  // (main hands --nats over to the build that serves it)
#endif
    if (const auto stuck = host.stuck_calls(); rc != 0 || stuck > 0) {  // (no teardown under threads in tools)
      if (stuck > 0) {
        const std::string text = "machina-toolhost: exiting with " + std::to_string(stuck) +
                                 " call(s) still stuck in tools past their deadline\n";
        (void)!::write(STDERR_FILENO, text.data(), text.size());
      }
      host.flush_audit();
      _exit(rc);
    }
    return rc;
  }
  const std::chrono::microseconds spin(machina::may_run_on_two_cpus() ? inv.spin_us : 0);
  std::unique_ptr<machina::cli::LineCodec> codec;
  std::string session = "serve-";
  if (inv.mode == Invocation::Mode::mcp || inv.mode == Invocation::Mode::skill) {
    const bool mcp = inv.mode == Invocation::Mode::mcp;
    codec = std::make_unique<machina::cli::JsonRpcCodec>(
        mcp ? machina::cli::JsonRpcCodec::Dialect::mcp : machina::cli::JsonRpcCodec::Dialect::skill, inv.mcp_page_size);
    session = mcp ? "mcp-" : "skill-";
  } else {
    codec = std::make_unique<machina::cli::NdjsonCodec>();
  }
  // The stream is a session of the hosted skills'.
  session += std::to_string(::getpid());
  host.session_started(session);
  const int rc = machina::cli::serve(host, *codec, {STDIN_FILENO, wire, inv.workers, 1024, spin, inv.state_per_call});
  host.session_ended(session);
  if (const auto stuck = host.stuck_calls(); stuck > 0) {
    // Their threads are still inside plugin code: leave without running destructors
    // under their feet. Every response has been written.
    const std::string text = "machina-toolhost: exiting with " + std::to_string(stuck) +
                             " call(s) still stuck in tools past their deadline\n";
    (void)!::write(STDERR_FILENO, text.data(), text.size());
    host.flush_audit();
    _exit(rc);
  }
  return rc;
}

/// The audit store of the executable's fronts: on unless `off` (--no-audit) or
/// MACHINA_TOOLHOST_AUDIT=0; a store named (--audit-db, --audit-jsonl or their variables)
/// is used as named, else the default one, $XDG_STATE_HOME/machina-toolhost/audit.db (or
/// ~/.local/state/...), in a folder of the user's only. The default store is optional: where
/// it cannot be made the host warns and serves without, and a store that cannot record
/// refuses no call unless `required_named` (--audit-required) or a JSON lines file is named. A call per process (`run`)
/// appends to the store's pending file (AuditOptions::pending).
void default_audit(machina::AuditOptions& audit, bool run, bool off, bool required_named) {
  const char* env = std::getenv("MACHINA_TOOLHOST_AUDIT");
  if (off) {
    audit.db_path.clear();
    audit.jsonl_path.clear();
    return;
  }
  if (!audit.db_path.empty() || (env != nullptr && std::strcmp(env, "0") == 0)) return;
  std::string base;
  if (const char* state = std::getenv("XDG_STATE_HOME"); state != nullptr && *state == '/') {
    base = state;
  } else if (const char* home = std::getenv("HOME"); home != nullptr && *home == '/') {
    base = std::string(home) + "/.local";
    (void)::mkdir(base.c_str(), 0700);
    base += "/state";
  } else {
    return;  // (no home: nowhere that is the user's)
  }
  (void)::mkdir(base.c_str(), 0700);
  const std::string folder = base + "/machina-toolhost";
  if (::mkdir(folder.c_str(), 0700) != 0 && errno == EEXIST) (void)::chmod(folder.c_str(), 0700);
  audit.db_path = folder + "/audit.db";
  audit.optional = true;
  audit.pending = run && audit.jsonl_path.empty();
  if (!required_named && audit.jsonl_path.empty()) audit.required = machina::AuditRequired::none;
}

/// `--run AID` and `--run PLUGIN AID` with nothing else are most of what spawning
/// clients send, and building the full parser costs about as much as the call: these
/// two shapes are recognised directly and mean exactly what the parser would make of them.
bool fast_run(int argc, char** argv, Invocation& inv) {
  if (argc < 3 || argc > 4 || std::strcmp(argv[1], "--run") != 0) return false;
  for (int i = 2; i < argc; ++i) {
    if (argv[i][0] == '-' || argv[i][0] == '\0') return false;
  }
  inv.mode = Invocation::Mode::run;
  if (argc == 4) inv.plugins.emplace_back(argv[2]);
  inv.aid = argv[argc - 1];
  inv.options = machina::HostOptions::from_env();
  default_audit(inv.options.audit, /*run=*/true, /*off=*/false, /*required_named=*/false);
  std::error_code ec;
  inv.options.workers.executable = fs::read_symlink("/proc/self/exe", ec).string();  // shell.exec's launcher
  report_events(inv.options);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  // The launcher of a confined program (a sandboxed Python tool worker), started by the
  // host itself: `--sandbox-exec SPEC -- PROGRAM ARGS...` (isolation/sandbox_exec.hpp).
  if (argc >= 5 && std::strcmp(argv[1], "--sandbox-exec") == 0 && std::strcmp(argv[3], "--") == 0) {
    try {
      return machina::sandbox::exec_in_sandbox(machina::sandbox::ExecSpec::from_json(argv[2]), argv + 4);
    } catch (const machina::HostError& e) {
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
    if (needs_plugin_loader(!fast.plugins.empty())) hand_over_to_plugin_loader(argv);
#endif
    try {
      return execute(fast);
    } catch (const machina::HostError& e) {
      const std::string text = std::string("machina-toolhost: ") + e.what() + "\n";
      (void)!::write(STDERR_FILENO, text.data(), text.size());
      return 2;
    }
  }

  CLI::App app{"machina-toolhost " MACHINA_VERSION
               " - runs tools for AI agents: one request in, one structured\n"
               "response out, with input caps, idempotency, leases and a circuit breaker.\n"
               "Without --plugin (or a PLUGIN argument) the built-in tools are loaded.",
               "machina-toolhost"};
  app.set_version_flag("--version", MACHINA_VERSION);

  std::vector<std::string> plugins;
  app.add_option("--plugin", plugins, "Load this plugin library (repeatable)")->type_name("PATH");
  std::vector<std::string> manifests;
  app.add_option("--tools", manifests,
                 "Load the tools this TOML tool manifest declares (Python tools, HTTP tool services), beside the "
                 "plugins' (repeatable; docs/python-tools.md)")
      ->type_name("FILE");
  std::string packs_text;
  app.add_option("--packs", packs_text,
                 "The built-in tool packs to serve, comma-separated (files, shell, code, python), or none (default: "
                 "all of them "
                 "when no plugin is named, else none; docs/tool-packs.md)")
      ->type_name("LIST");
  std::string policy_file;
  app.add_option("--policy", policy_file,
                 "The tool packs' security policy, a TOML file (default: $MACHINA_TOOLHOST_POLICY, else safe "
                 "defaults: files under the workspace, no command allowed; docs/tool-packs.md)")
      ->type_name("FILE");
  bool list = false;
  auto* list_opt = app.add_flag("--list", list, "Print the registered tools as JSON and exit");
  std::vector<std::string> run_args;
  auto* run_opt =
      app.add_option("--run", run_args, "Run one call: read a JSON request from stdin, write one JSON response")
          ->expected(1, 2)
          ->type_name("[PLUGIN] AID");
  std::vector<std::string> serve_args;
  auto* serve_opt =
      app.add_option("--serve", serve_args, "Serve NDJSON requests from stdin, one response line each, until EOF")
          ->expected(0, 1)
          ->type_name("[PLUGIN]");
  unsigned workers = 1;
  app.add_option("--workers", workers, "Calls run concurrently in --serve (responses with an id may come out of order)")
      ->check(CLI::Range(1u, 256u))
      ->capture_default_str();
  unsigned spin_us = 50;
  app.add_option("--spin-us", spin_us,
                 "In --serve, poll for the next request this many microseconds before sleeping (a lock-step "
                 "client's next call then costs no wake-up); 0: never. Only when the process may use two CPUs. "
                 "Given twice, the last counts")
      ->check(CLI::Range(0u, 10000u))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->capture_default_str();

  std::string http_address;
  auto* http_opt =
      app.add_option("--http", http_address,
                     "Serve tools over HTTP (tool protocol v1's service runner and capability handshake) on "
                     "this address (numeric, or localhost) and port (port 0: any free "
                     "one, said on stderr); bearer token from MACHINA_TOOLHOST_HTTP_TOKEN if set, required "
                     "off loopback; only JSON bodies, "
                     "the host's own Host names and no foreign Origin are served (docs/python-tools.md)")
          ->type_name("HOST:PORT");
  std::size_t http_max_connections = 256;
  app.add_option("--http-max-connections", http_max_connections, "In --http, connections at once (more: 503)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{65536}))
      ->capture_default_str();
  std::size_t http_max_per_peer = 32;
  app.add_option("--http-max-connections-per-peer", http_max_per_peer,
                 "In --http, connections at once from one client address (more: 503)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{65536}))
      ->capture_default_str();
  int http_header_timeout_ms = 10'000;
  app.add_option("--http-header-timeout-ms", http_header_timeout_ms,
                 "In --http, a request's headers must arrive within this (a new connection's: from its accept; "
                 "else 408 and the connection is closed)")
      ->check(CLI::Range(100, 600'000))
      ->capture_default_str();
  std::vector<std::string> http_allow_origins, http_allow_hosts;
  app.add_option("--http-allow-origin", http_allow_origins,
                 "In --http, serve requests carrying this Origin (repeatable; a request with any other Origin: 403), "
                 "e.g. http://localhost:3000")
      ->type_name("ORIGIN");
  app.add_option("--http-allow-host", http_allow_hosts,
                 "In --http, serve requests whose Host is this name (any port; NAME:PORT pins one; repeatable) "
                 "beside the bound address and, on loopback, localhost (any other Host: 403)")
      ->type_name("NAME");
  std::string nats_url;
  auto* nats_opt = app.add_option("--nats", nats_url,
                                  "Serve every tool as a NATS micro service on the server at this URL (subjects "
                                  "PREFIX.call, PREFIX.tools, PREFIX.tool.<aid>, the tools.* names; $SRV discovery; "
                                  "docs/nats.md). Idempotency keys: this host's own cache, or one store shared by a "
                                  "group of hosts (--nats-idempotency kv). "
                                  "Default --workers: 32")
                       ->type_name("URL");
  std::string nats_prefix = "machina";
  app.add_option("--nats-prefix", nats_prefix, "In --nats, the subjects' prefix")->capture_default_str();
  std::string nats_queue_group = "q";
  app.add_option("--nats-queue-group", nats_queue_group,
                 "In --nats, the queue group: the hosts of one group share the calls")
      ->capture_default_str();
  int nats_max_pending = 4096;
  app.add_option("--nats-max-pending", nats_max_pending,
                 "In --nats, messages waiting per subscription beyond the calls running; more are dropped (the "
                 "callers see no answer) and said on stderr")
      ->check(CLI::Range(1, 1'000'000))
      ->capture_default_str();
  std::string nats_idempotency = "local";
  app.add_option("--nats-idempotency", nats_idempotency,
                 "In --nats, where calls with an idempotency key are kept: local (this host's own cache) or kv (a "
                 "JetStream key-value bucket shared by the hosts of the group: a key runs its tool once on any "
                 "host; needs --kv-key-file)")
      ->check(CLI::IsMember({"local", "kv"}))
      ->capture_default_str();
  machina::cli::NatsFrontOptions nats_store;
  app.add_option("--nats-kv-bucket", nats_store.kv_bucket, "In --nats-idempotency kv, the key-value bucket's name")
      ->capture_default_str();
  std::string kv_key_file;
  app.add_option("--kv-key-file", kv_key_file,
                 "In --nats-idempotency kv, the file of the key (at least 32 bytes) the group's hosts sign the "
                 "shared store's entries with; their clients must not have it")
      ->type_name("FILE");
  app.add_option("--nats-kv-ttl-s", nats_store.kv_ttl_s,
                 "In --nats-idempotency kv, seconds an entry lasts (the bucket's maximum age, set when the first "
                 "host makes it)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{10} * 365 * 86400))
      ->capture_default_str();
  app.add_option("--nats-claim-grace-ms", nats_store.claim_grace_ms,
                 "In --nats-idempotency kv, how long past its call's deadline a claim holds before a duplicate is "
                 "told that the outcome is unknown (its host is taken for dead)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{86'400'000}))
      ->capture_default_str();
  machina::cli::NatsFrontOptions nats_durable;
  app.add_flag("--nats-durable", nats_durable.durable,
               "In --nats, also take calls from a JetStream work-queue stream (subject PREFIX.durable.call; "
               "at most 100000 messages or 256 MiB, beyond which a publish is refused; one re-sent within 2 minutes "
               "is dropped) through a "
               "durable pull consumer the hosts share: explicit acks, messages fetched only for idle workers, "
               "in progress while running, the answer to the Machina-Reply-To header, a call without an "
               "idempotency key keyed by its Nats-Msg-Id (docs/nats.md)");
  app.add_option("--nats-stream", nats_durable.stream, "In --nats-durable, the stream's name")->capture_default_str();
  app.add_option("--nats-consumer", nats_durable.consumer, "In --nats-durable, the consumer the hosts share")
      ->capture_default_str();
  app.add_option("--nats-ack-wait-s", nats_durable.ack_wait_s,
                 "In --nats-durable, seconds a message may go unacknowledged and without word of progress before "
                 "it is delivered again (progress is said every third of it)")
      ->check(CLI::Range(0.1, 86400.0))
      ->capture_default_str();
  app.add_option("--nats-max-deliver", nats_durable.max_deliver, "In --nats-durable, deliveries of one message at most")
      ->check(CLI::Range(1, 1'000'000))
      ->capture_default_str();
  bool mcp = false;
  auto* mcp_opt = app.add_flag("--mcp", mcp,
                               "Serve every tool as an MCP server on stdio (JSON-RPC 2.0, one message a line; "
                               "concurrent calls, cancellation, progress; docs/jsonrpc.md). Default --workers: 32");
  std::size_t mcp_page_size = 100;
  app.add_option("--mcp-page-size", mcp_page_size, "In --mcp, tools per tools/list page (nextCursor for the rest)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{100000}))
      ->capture_default_str();
  bool skill = false;
  auto* skill_opt = app.add_flag("--skill", skill,
                                 "Serve every tool as a seed-001 skill on stdio (initialize, tools/call, lifecycle/*, "
                                 "shutdown; docs/jsonrpc.md). Default --workers: 32");
  bool state_per_call = false;
  app.add_flag("--state-per-call", state_per_call,
               "In --serve, each request runs with the ds_state it carries, or an empty one, and nothing is "
               "kept for the next (by default one state lives for the whole stream)");

  machina::HostOptions options = machina::HostOptions::from_env();
  app.add_option("--max-request-bytes", options.max_request_bytes, "Largest request (stdin or line)")
      ->check(CLI::Range(std::size_t{2}, std::size_t{1} << 30))
      ->capture_default_str();
  app.add_option("--max-output-bytes", options.max_output_bytes, "Largest tool output")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 30))
      ->capture_default_str();
  app.add_option("--idempotency-ttl-ms", options.idempotency.ttl_ms, "How long a result is kept for its key")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{86'400'000}))
      ->capture_default_str();
  app.add_option("--idempotency-max-entries", options.idempotency.max_entries,
                 "Most results kept, and calls with a key running at once (beyond them: overloaded)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{10'000'000}))
      ->capture_default_str();
  app.add_option("--idempotency-max-key-bytes", options.idempotency.max_key_bytes,
                 "Longest idempotency_key accepted (a longer one is a malformed request)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20))
      ->capture_default_str();
  app.add_option("--idempotency-max-bytes", options.idempotency.max_stored_bytes,
                 "Bytes of results kept in all (the oldest go first; a larger result is answered, not kept)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 40))
      ->capture_default_str();
  app.add_option("--breaker-threshold", options.breaker.threshold,
                 "Host-side failures in the window that open a tool's breaker")
      ->check(CLI::Range(1u, 1'000'000u))
      ->capture_default_str();
  app.add_option("--breaker-window-ms", options.breaker.window_ms, "The breaker's rolling window")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{86'400'000}))
      ->capture_default_str();
  app.add_option("--breaker-cooldown-ms", options.breaker.cooldown_ms, "How long an open breaker refuses calls")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{86'400'000}))
      ->capture_default_str();

  app.add_option(
         "--timeout-ms", options.default_timeout_ms,
         "Deadline per call unless the request (timeout_ms), the operator (--tool-timeout) or the tool says otherwise")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{86'400'000}))
      ->capture_default_str()
      ->group("Deadlines and isolation");
  app.add_option("--max-timeout-ms", options.max_timeout_ms, "Ceiling on every call's deadline")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{86'400'000}))
      ->capture_default_str()
      ->group("Deadlines and isolation");
  std::vector<std::string> tool_timeouts;
  app.add_option("--tool-timeout", tool_timeouts, "Deadline for one tool (repeatable)")
      ->type_name("AID=MS")
      ->group("Deadlines and isolation");
  app.add_option("--max-stuck-calls", options.max_stuck_calls,
                 "Inline: calls past their deadline whose tools still hold a thread; at this many, new calls are "
                 "refused (overloaded)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{4096}))
      ->capture_default_str()
      ->group("Deadlines and isolation");
  std::string isolation = "inline";
  app.add_option("--isolation", isolation,
                 "Where tools run: inline (in this process, fastest) or process (supervised worker processes: a "
                 "crash, exit or hang costs one call)")
      ->check(CLI::IsMember({"inline", "process"}))
      ->capture_default_str()
      ->group("Deadlines and isolation");
  std::size_t isolation_workers = 0;
  app.add_option("--isolation-workers", isolation_workers, "Worker processes (default: --workers)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{256}))
      ->group("Deadlines and isolation");
  app.add_option("--python-workers", options.python_workers,
                 "Python tools: worker interpreters per interpreter and set-up, unless the manifest says (default: "
                 "--workers)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{256}))
      ->group("Deadlines and isolation");
  app.add_option("--skill-tick-ms", options.skill_tick_ms,
                 "Skills of the lifecycle/* layout: lifecycle/onTick this often unless their manifest says "
                 "(tick_interval_ms; 0: never)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{86'400'000}))
      ->capture_default_str()
      ->group("Deadlines and isolation");
  app.add_option("--python-memory-mb", options.python_memory_mb,
                 "Python tools: a worker resident past this many MiB is killed and replaced (its call fails "
                 "tool_crashed), unless the manifest says; 0: no cap")
      ->check(CLI::Range(std::uint64_t{0}, std::uint64_t{1} << 20))
      ->capture_default_str()
      ->group("Deadlines and isolation");
  machina::WorkerLimits& limits = options.workers.limits;
  app.add_option("--limit-cpu-s", limits.cpu_seconds,
                 "Process isolation: CPU seconds per call (SIGXCPU ends the worker)")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{86'400}))
      ->group("Deadlines and isolation");
  app.add_option("--limit-memory-mb", limits.address_space_mb,
                 "Process isolation: address space per worker (RLIMIT_AS)")
      ->check(CLI::Range(std::uint64_t{16}, std::uint64_t{1} << 30))
      ->group("Deadlines and isolation");
  app.add_option("--limit-open-files", limits.open_files, "Process isolation: open files per worker (RLIMIT_NOFILE)")
      ->check(CLI::Range(std::uint64_t{8}, std::uint64_t{1} << 20))
      ->group("Deadlines and isolation");
  app.add_option("--limit-file-size-mb", limits.file_size_mb,
                 "Process isolation: largest file a worker may write (RLIMIT_FSIZE)")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 30))
      ->group("Deadlines and isolation");
  app.add_flag("--no-network", limits.no_network,
               "Process isolation: tools cannot create sockets (seccomp; socketpair still works) and have no "
               "network interface (a network namespace of their own)")
      ->group("Deadlines and isolation");
  app.add_option("--worker-env", options.workers.pass_env,
                 "Process isolation: also pass this variable of the host's environment to tools (repeatable); they "
                 "get only PATH, HOME, USER, LOGNAME, LANG, LC_ALL, LC_CTYPE, TZ, TMPDIR, LD_LIBRARY_PATH, "
                 "MACHINA_TOOLHOST_WORKSPACE and the sanitizer options otherwise")
      ->type_name("NAME")
      ->group("Deadlines and isolation");
  machina::AuditOptions& audit = options.audit;
  bool no_audit = false;
  auto* no_audit_opt = app.add_flag("--no-audit", no_audit,
                                    "Record no call (the audit store is on by default, in "
                                    "$XDG_STATE_HOME/machina-toolhost/audit.db; also MACHINA_TOOLHOST_AUDIT=0)")
                           ->group("Audit");
  app.add_option("--audit-db", audit.db_path,
                 "Record every call (tool, front, user, a digest of its arguments, status, duration) in this SQLite "
                 "database (made if missing; also MACHINA_TOOLHOST_AUDIT_DB; default: "
                 "$XDG_STATE_HOME/machina-toolhost/audit.db, else ~/.local/state/machina-toolhost/audit.db)")
      ->type_name("FILE")
      ->excludes(no_audit_opt)
      ->group("Audit");
  app.add_option("--audit-jsonl", audit.jsonl_path,
                 "Also write each call as a JSON line to this file (also MACHINA_TOOLHOST_AUDIT_JSONL)")
      ->type_name("FILE")
      ->excludes(no_audit_opt)
      ->group("Audit");
  app.add_option("--audit-retention-days", audit.retention_days, "Calls older than this are deleted from the database")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{36'500}))
      ->capture_default_str()
      ->group("Audit");
  app.add_option("--audit-max-rows", audit.max_rows, "The database keeps at most this many calls (the newest)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40))
      ->capture_default_str()
      ->group("Audit");
  std::uint64_t audit_jsonl_max_mb = audit.jsonl_max_bytes >> 20;
  app.add_option("--audit-jsonl-max-mb", audit_jsonl_max_mb,
                 "The JSON lines file is moved to FILE.1 (replacing it) when it would grow past this")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 20))
      ->capture_default_str()
      ->group("Audit");
  std::string audit_required = "leased";
  app.add_option("--audit-required", audit_required,
                 "Calls answered only once recorded: leased (of tools of tier > 0), all, or none; while the store "
                 "cannot record (a full disk) they are refused with audit_unavailable")
      ->check(CLI::IsMember({"leased", "all", "none"}))
      ->capture_default_str()
      ->group("Audit");

  // The worker side of --isolation process (started by the host itself, not by people).
  bool worker_mode = false;
  long parent_pid = 0;
  app.add_flag("--isolation-worker", worker_mode)->group("");
  bool linked_tools = false;  // the worker registers the tools linked into this program
  app.add_flag("--linked-tools", linked_tools)->group("");
  app.add_option("--parent-pid", parent_pid)->group("");
  std::size_t isolation_spares = 2;
  app.add_option("--isolation-spares", isolation_spares)->check(CLI::Range(std::size_t{1}, std::size_t{64}))->group("");
  std::vector<std::string> hidden_files;
  app.add_option("--isolation-hide", hidden_files)->group("");

  list_opt->excludes(run_opt)
      ->excludes(serve_opt)
      ->excludes(http_opt)
      ->excludes(mcp_opt)
      ->excludes(skill_opt)
      ->excludes(nats_opt);
  run_opt->excludes(serve_opt)->excludes(http_opt)->excludes(mcp_opt)->excludes(skill_opt)->excludes(nats_opt);
  serve_opt->excludes(http_opt)->excludes(mcp_opt)->excludes(skill_opt)->excludes(nats_opt);
  http_opt->excludes(mcp_opt)->excludes(skill_opt)->excludes(nats_opt);
  mcp_opt->excludes(skill_opt)->excludes(nats_opt);
  skill_opt->excludes(nats_opt);

  // The command line a dispatch layer builds for `machina_cli`: `tool_exec [PLUGIN] AID`,
  // the request on stdin, served as --run.
  std::vector<std::string> tool_exec_args;
  auto* tool_exec_cmd = app.add_subcommand("tool_exec",
                                           "Run one call as --run [PLUGIN] AID does (the command line "
                                           "a dispatch layer gives machina_cli; docs/operations.md)");
  tool_exec_cmd->add_option("aid", tool_exec_args, "[PLUGIN] AID")->expected(1, 2)->required();
  tool_exec_cmd->fallthrough();
  auto* lease_cmd =
      app.add_subcommand("lease", "Operator commands for leases (need MACHINA_LEASE_SECRET or MACHINA_LEASE_KEY_FILE)");
  lease_cmd->require_subcommand(1);
  auto* issue_cmd = lease_cmd->add_subcommand("issue", "Print a single-use lease token for one tool");
  std::string lease_aid;
  double lease_ttl_s = 60;
  issue_cmd->add_option("--aid", lease_aid, "The tool the lease is for")->required();
  issue_cmd->add_option("--ttl", lease_ttl_s, "Seconds the lease stays valid")->capture_default_str();

  auto* audit_cmd = app.add_subcommand("audit", "Questions about the audit store");
  audit_cmd->require_subcommand(1);
  auto* report_cmd = audit_cmd->add_subcommand(
      "report",
      "Most used tools, most accessed paths, error rates and latency percentiles per tool, over a time range");
  machina::AuditReportOptions report;
  std::string report_since, report_until, report_format = "text";
  report_cmd
      ->add_option("--db", report.db_path,
                   "The audit database (default: $MACHINA_TOOLHOST_AUDIT_DB, else the default store)")
      ->type_name("FILE");
  report_cmd->add_option("--since", report_since, "From this time (UTC YYYY-MM-DD[THH:MM[:SS]], or 24h, 7d ... ago)");
  report_cmd->add_option("--until", report_until, "Until this time (excluded), as --since");
  report_cmd->add_option("--top", report.top, "How many tools, paths and users to list")
      ->check(CLI::Range(std::size_t{1}, std::size_t{100'000}))
      ->capture_default_str();
  report_cmd->add_option("--format", report_format, "text or json")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();

  app.footer([] {
    // The docs/*.md files the options name, as installed with the package (or in the source).
    std::string docs = "the docs/ folder of the project's source";
    try {
      docs = fs::path(find_package_file("docs/protocol.md", "the documentation", "")).parent_path().string();
    } catch (const machina::HostError&) {
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
  });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) suggest_options(app, app.remaining());
    return rc == 0 ? 0 : 2;
  }

  if (*tool_exec_cmd) {
    if (run_opt->count() > 0 || list || serve_opt->count() > 0 || http_opt->count() > 0 || mcp_opt->count() > 0 ||
        skill_opt->count() > 0 || nats_opt->count() > 0) {
      std::cerr << "machina-toolhost: tool_exec runs one call, as --run: it takes none of --run, --list, --serve, "
                   "--http, --mcp, --skill, --nats\n";
      return 2;
    }
    run_args = tool_exec_args;
  }
  const bool run_mode = run_opt->count() > 0 || *tool_exec_cmd;
  if (run_args.size() == 2) plugins.push_back(run_args[0]);
  if (serve_args.size() == 1 && !serve_args[0].empty()) plugins.push_back(serve_args[0]);
#ifndef MACHINA_WITH_NATS
  if (!*issue_cmd && !*audit_cmd && nats_opt->count() > 0) hand_over_to_nats_build(argv);
#endif
#ifdef MACHINA_LINKED_TOOLS
  // Tool manifests too: their HTTP services' host names need the C library's resolver.
  if (!*issue_cmd && !*audit_cmd && needs_plugin_loader(!plugins.empty() || !manifests.empty())) {
    hand_over_to_plugin_loader(argv);
  }
#endif

  if (worker_mode) {
    machina::worker::WorkerConfig wc;
    wc.load_tools = [&](machina::ToolRegistry& registry) {
#ifdef MACHINA_LINKED_TOOLS
      if (linked_tools) registry.add_plugin(std::string(machina::kLinkedPluginSource), kLinkedTools, nullptr);
#else
      if (linked_tools) throw machina::HostError("--linked-tools: this build of machina-toolhost has no linked tools");
      for (const auto& p : plugins) registry.load_plugin(p, nullptr);
#endif
    };
    wc.limits = limits;
    wc.walls.own_network = limits.no_network;
    wc.walls.hidden_files = hidden_files;
    wc.spares = isolation_spares;
    wc.max_output_bytes = options.max_output_bytes;
    wc.max_frame_bytes = 10 * options.max_request_bytes + (1u << 20);
    wc.parent_pid = parent_pid;
    return machina::worker::run_worker(wc);
  }

  try {
    for (const auto& spec : tool_timeouts) {
      const auto eq = spec.rfind('=');
      std::int64_t ms = 0;
      if (eq == std::string::npos || eq == 0 || !parse_positive(spec.substr(eq + 1), ms))
        throw machina::HostError("--tool-timeout " + spec + ": expected AID=MILLISECONDS");
      options.tool_timeouts_ms[spec.substr(0, eq)] = ms;
    }
    {
      // Isolated workers and sandboxed Python tools are started through this program.
      std::error_code ec;
      options.workers.executable = fs::read_symlink("/proc/self/exe", ec).string();
    }
    if (isolation == "process") {
      options.isolation = machina::Isolation::process;
      options.workers.size = isolation_workers != 0 ? isolation_workers : workers;
    }
    if (app.get_option("--python-workers")->count() == 0) options.python_workers = workers;
    report_events(options);
    audit.jsonl_max_bytes = audit_jsonl_max_mb << 20;
    audit.required = machina::parse_audit_required(audit_required);
    if (!*issue_cmd) default_audit(audit, run_mode, no_audit, app.get_option("--audit-required")->count() > 0);
    if (*report_cmd) {
      if (report.db_path.empty()) report.db_path = options.audit.db_path;  // (the default store, if none is named)
      if (report.db_path.empty()) throw machina::HostError("audit report: name the database (--db FILE)");
      const std::int64_t now = machina::unix_now_ms();
      if (!report_since.empty()) report.since_ms = machina::parse_audit_time(report_since, now);
      if (!report_until.empty()) report.until_ms = machina::parse_audit_time(report_until, now);
      const auto result = machina::audit_report(report);
      std::cout << (report_format == "json" ? result.dump(2) + "\n" : machina::audit_report_text(result));
      return 0;
    }
    if (*issue_cmd) {
      machina::LeaseAuthority authority(machina::load_lease_secret(), {});
      const auto ttl_ms = machina::lease_ttl_ms(lease_ttl_s, authority.options().max_ttl_ms);
      std::cout << authority.issue(lease_aid, ttl_ms, machina::unix_now_ms()) << "\n";
      return 0;
    }
    if (!list && !run_mode && serve_opt->count() == 0 && http_opt->count() == 0 && !mcp && !skill &&
        nats_opt->count() == 0) {
      std::cerr
          << "machina-toolhost: choose one of --list, --run, --serve, --http, --mcp, --skill, --nats (see --help)\n";
      return 2;
    }
    Invocation inv;
    inv.mode = list                     ? Invocation::Mode::list
               : run_mode               ? Invocation::Mode::run
               : http_opt->count() > 0  ? Invocation::Mode::http
               : mcp_opt->count() > 0   ? Invocation::Mode::mcp
               : skill_opt->count() > 0 ? Invocation::Mode::skill
               : nats_opt->count() > 0  ? Invocation::Mode::nats
                                        : Invocation::Mode::serve;
    // The JSON-RPC fronts read on while calls run (a cancellation must reach them); NATS
    // requests arrive from many callers at once.
    if ((inv.mode == Invocation::Mode::mcp || inv.mode == Invocation::Mode::skill ||
         inv.mode == Invocation::Mode::nats) &&
        app.get_option("--workers")->count() == 0) {
      workers = 32;
    }
    if (inv.mode == Invocation::Mode::http) {
      const auto colon = http_address.rfind(':');
      if (colon == std::string::npos || colon == 0 || colon + 1 == http_address.size())
        throw machina::HostError("--http " + http_address + ": expected HOST:PORT");
      inv.http.host = http_address.substr(0, colon);
      if (inv.http.host.size() > 2 && inv.http.host.front() == '[' && inv.http.host.back() == ']')
        inv.http.host = inv.http.host.substr(1, inv.http.host.size() - 2);
      inv.http.port = http_address.substr(colon + 1);
      std::int64_t port = 0;
      if (inv.http.port != "0" && (!parse_positive(inv.http.port, port) || port > 65535))
        throw machina::HostError("--http " + http_address + ": the port must be 0..65535");
      inv.http.max_connections = http_max_connections;
      inv.http.max_connections_per_peer = http_max_per_peer;
      inv.http.header_timeout_ms = http_header_timeout_ms;
      inv.http.allow_origins = http_allow_origins;
      inv.http.allow_hosts = http_allow_hosts;
      // The token stays in this process only: no tool inherits it.
      if (const char* token = std::getenv("MACHINA_TOOLHOST_HTTP_TOKEN"); token != nullptr && *token != '\0') {
        inv.http.token = token;
        ::unsetenv("MACHINA_TOOLHOST_HTTP_TOKEN");
      }
      machina::cli::check_http_front_options(inv.http);  // before any tool is loaded
    }
    if (inv.mode == Invocation::Mode::nats) {
      inv.nats.url = nats_url;
      inv.nats.prefix = nats_prefix;
      inv.nats.queue_group = nats_queue_group;
      inv.nats.workers = workers;
      inv.nats.max_pending = nats_max_pending;
      inv.nats.durable = nats_durable.durable;
      inv.nats.stream = nats_durable.stream;
      inv.nats.consumer = nats_durable.consumer;
      inv.nats.ack_wait_s = nats_durable.ack_wait_s;
      inv.nats.max_deliver = nats_durable.max_deliver;
      inv.nats.shared_store = nats_idempotency == "kv";
      inv.nats.kv_bucket = nats_store.kv_bucket;
      inv.nats.kv_ttl_s = nats_store.kv_ttl_s;
      inv.nats.claim_grace_ms = nats_store.claim_grace_ms;
#ifdef MACHINA_WITH_NATS
      if (inv.nats.shared_store) {
        if (kv_key_file.empty())
          throw machina::HostError(
              "--nats-idempotency kv needs --kv-key-file FILE: the key (at least 32 bytes) the "
              "group's hosts sign the shared store's entries with");
        inv.nats.kv_key = machina::cli::load_kv_key(kv_key_file);
      }
      machina::cli::check_nats_front_options(inv.nats);  // before any tool is loaded
#endif
    }
    inv.plugins = plugins;
    inv.manifests = manifests;
    if (app.get_option("--packs")->count() > 0) {
      std::vector<std::string> names;
      std::stringstream in(packs_text);
      for (std::string name; std::getline(in, name, ',');) {
        if (!name.empty()) names.push_back(name);
      }
      if (names.empty())
        throw machina::HostError("--packs: name at least one pack (files, shell, code, python) or none");
      inv.packs = names;
    }
    inv.policy_file = policy_file;
    if (!run_args.empty()) inv.aid = run_args.back();
    inv.workers = workers;
    inv.mcp_page_size = mcp_page_size;
    inv.spin_us = spin_us;
    inv.state_per_call = state_per_call;
    inv.options = std::move(options);
    return execute(inv);
  } catch (const machina::HostError& e) {
    std::cerr << "machina-toolhost: " << e.what() << "\n";
    return 2;
  }
}
