// What machina-toolhost does once its command line is understood: the mode, the tools to
// load and the options of the host and of its front; execute() sets the host up and hands
// over to the front. Compiled into each build (the tools linked in, the NATS front).
#pragma once

#include "http_front.hpp"
#include "nats_front.hpp"

#include <machina/tool_host.hpp>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace machina::cli {

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
  HttpFrontOptions http;                          // --http
  NatsFrontOptions nats;                          // --nats
  HostOptions options;
};

/// What every start of this program sets in the host's options: isolated workers and
/// sandboxed Python tools are started through this program, and the host's events (a call
/// overran, a worker was lost) are lines on stderr.
void set_up_for_this_program(HostOptions& options);

/// Sets the host up, loads the tools and runs the front; returns the exit code. Throws
/// ConfigError for a setup that cannot be served.
int execute(Invocation& inv);

#ifdef MACHINA_LINKED_TOOLS
/// The built-in pack linked into this build.
PluginEntryPoints linked_tools();
#endif

}  // namespace machina::cli
