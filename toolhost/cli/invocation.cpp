// The host of one invocation set up and handed to its front.
#include "invocation.hpp"

#include "codecs/mcp_skill_codec.hpp"
#include "codecs/ndjson_codec.hpp"
#include "line_server.hpp"
#include "package_paths.hpp"
#include "say.hpp"

#include <machina/lease.hpp>
#include <machina/spin_wait.hpp>
#include <machina/tool_host.hpp>
#include <machina/tool_list.hpp>

#include <fcntl.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>

#ifdef MACHINA_LINKED_TOOLS
// This build has the built-in pack (plugins/builtin/builtin_tools.cpp) linked in and is
// linked fully statically, so that a process per call starts as a static program does.
// It cannot load plugin libraries; for those it hands over to the plugin-loading build.
extern "C" std::uint32_t machina_plugin_abi_version(void);
extern "C" int machina_plugin_register(const machina_registrar_api* api, machina_registrar* registrar);
#endif

namespace machina::cli {

#ifdef MACHINA_LINKED_TOOLS
PluginEntryPoints linked_tools() {
  return {&machina_plugin_abi_version, &machina_plugin_register};
}
#endif

namespace {

/// The tools of this invocation, for ToolHost::load_default_tools: the plugins named (none:
/// the built-in tools), the packs --packs names ("none": none), the manifests named.
ToolChoice tool_choice(const Invocation& inv) {
  ToolChoice choice;
  if (!inv.plugins.empty()) choice.plugins = inv.plugins;
  if (inv.packs && !(inv.packs->size() == 1 && inv.packs->front() == "none"))
    choice.packs = inv.packs;
  else if (inv.packs)
    choice.packs = std::vector<std::string>{};
  choice.policy_file = inv.policy_file;
  choice.manifests = inv.manifests;
#ifdef MACHINA_LINKED_TOOLS
  choice.linked_builtin = linked_tools();  // (with plugins named, main() has handed over to the plugin loader)
#else
  if (inv.plugins.empty()) choice.builtin_plugin = find_builtin_plugin();
  choice.load_library = &ToolHost::load_plugin;
#endif
  return choice;
}

/// stdout belongs to the protocol: keep the real stdout as the wire and point fd 1 at
/// stderr, so nothing a plugin prints can reach the stream.
int take_stdout_for_wire() {
  const int wire = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
  if (wire < 0 || dup2(STDERR_FILENO, STDOUT_FILENO) < 0) throw ConfigError("cannot set up the output stream");
  return wire;
}

/// Leaves without running destructors when calls are still stuck in tools (their threads
/// are inside plugin code) or the front failed; every response has been written.
int leave(Host& host, int rc, bool exit_on_failure) {
  const auto stuck = host.stuck_calls();
  if (stuck == 0 && !(exit_on_failure && rc != 0)) return rc;
  if (stuck > 0) {
    say("exiting with " + std::to_string(stuck) + " call(s) still stuck in tools past their deadline");
  }
  host.flush_audit();
  _exit(rc);
}

}  // namespace

void set_up_for_this_program(HostOptions& options) {
  std::error_code ec;
  options.workers.executable = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  options.on_event = [](std::string_view line) { say(line); };
}

int execute(Invocation& inv) {
  // Out of the environment (and /proc/self/environ) before any plugin code runs (loading
  // included); the host still has it. (After any hand-over to the plugin loader, which
  // needs it in its environment.)
  protect_lease_secret(/*unset=*/true);
  // Before any plugin code runs, so nothing it prints reaches the wire.
  const int wire = take_stdout_for_wire();
  // With isolated tools, no process of this user may open this one's /proc files (its
  // descriptors, its memory) or trace it; the sandbox already hides it from them.
  if (inv.options.isolation == Isolation::process) prctl(PR_SET_DUMPABLE, 0);
  ToolHost tool_host(inv.options);
  if (const std::string& why = tool_host.host().audit_unavailable(); !why.empty())
    say(why + "; running without the audit database (--no-audit: no warning)");
  tool_host.load_default_tools(tool_choice(inv));
  Host& host = tool_host.host();

  if (inv.mode == Invocation::Mode::list) {
    return write_all(wire, "{\"ok\":true,\"tools\":" + tool_list_json(host) + "}\n") ? 0 : 1;
  }
  if (inv.mode == Invocation::Mode::run) {
    const int rc = run_once(host, inv.aid, STDIN_FILENO, wire);
    // The one response is written: tearing the host down (registry, schemas, plugins)
    // would only cost time. Worker processes are stopped properly.
    if (inv.options.isolation == Isolation::inline_threads) {
      host.flush_audit();
      _exit(rc);
    }
    return rc;
  }
  if (inv.mode == Invocation::Mode::http || inv.mode == Invocation::Mode::nats) {
#ifdef MACHINA_WITH_NATS
    const int rc = inv.mode == Invocation::Mode::http ? serve_http(host, inv.http) : serve_nats(host, inv.nats);
#else
    const int rc = serve_http(host, inv.http);  // (main hands --nats over to the build that serves it)
#endif
    return leave(host, rc, /*exit_on_failure=*/true);  // (no teardown under threads in tools)
  }
  const std::chrono::microseconds spin(may_run_on_two_cpus() ? inv.spin_us : 0);
  std::unique_ptr<LineCodec> codec;
  std::string session = "serve-";
  if (inv.mode == Invocation::Mode::mcp || inv.mode == Invocation::Mode::skill) {
    const bool mcp = inv.mode == Invocation::Mode::mcp;
    codec = std::make_unique<McpSkillCodec>(mcp ? McpSkillCodec::Dialect::mcp : McpSkillCodec::Dialect::skill,
                                            inv.mcp_page_size);
    session = mcp ? "mcp-" : "skill-";
  } else {
    codec = std::make_unique<NdjsonCodec>();
  }
  // The stream is a session of the hosted skills'.
  session += std::to_string(::getpid());
  host.connection_opened(session);
  const int rc = serve(host, *codec, {STDIN_FILENO, wire, inv.workers, 1024, spin, inv.state_per_call});
  host.connection_closed(session);
  return leave(host, rc, /*exit_on_failure=*/false);
}

}  // namespace machina::cli
