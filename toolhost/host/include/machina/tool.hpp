// A tool as the host knows it: its metadata (from a plugin or a worker that loaded one;
// later from a tool manifest), its compiled input schema, its breaker, and the runner that
// runs its calls. Native plugin tools also carry their C entry point.
#pragma once

#include <machina/plugin_abi.h>
#include <machina/circuit_breaker.hpp>
#include <machina/schema_validator.hpp>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace machina {

class Runner;

struct ToolInfo {
  std::string aid;
  std::string name;
  std::string description;
  std::string input_schema;  // JSON text, empty if none
  bool deterministic = false;
  std::vector<std::string> tags;
  std::vector<std::string> side_effects;
  bool replay_inputs = false;
  int tier = 0;
  std::uint32_t default_timeout_ms = 0;  // 0: the host's default
  std::string plugin_path;               // where it comes from (kLinkedPluginSource: linked in)
  // What a tool hosted from a skill or an MCP server says of itself besides (listed by
  // --list and the MCP front; empty: nothing said).
  std::string title;
  std::string output_schema;  // JSON text
  std::string annotations;    // JSON object text (MCP's readOnlyHint, destructiveHint ...)
  // The input schema listed for a tool whose schema the host does not check (it uses
  // keywords the host's validator does not have; the tool checks its input itself).
  std::string listed_schema;
  // Another name of the tool `alias_of` (a pack tool's service names), answering in the
  // service's shapes; fronts that list tools for a model list only the primary name.
  std::string alias_of;

  bool operator==(const ToolInfo&) const = default;
};

/// A native plugin tool's C entry point (null for tools that are not in this process).
struct NativeEntry {
  machina_tool_fn invoke = nullptr;
  void* tool_data = nullptr;
};

struct Tool {
  ToolInfo info;
  Runner* runner = nullptr;  // how its calls run (owned by the host; null in a worker)
  machina_tool_fn invoke = nullptr;
  void* tool_data = nullptr;
  mutable CircuitBreaker breaker;

  explicit Tool(const CircuitBreaker::Options& breaker_options) : breaker(breaker_options) {}

  /// Checks `info.input_schema` now (throws HostError if the host cannot check it), or,
  /// with `defer`, at the tool's first call: the host's own tools (the packs, plugins
  /// linked into the program) are not checked at every start of a `--run` process; a
  /// unit test compiles every one of their schemas instead.
  void compile_schema(bool defer);
  /// The input schema to check a call against, or null if the tool declares none.
  /// Thread-safe. Throws HostError if a deferred schema does not compile.
  const SchemaValidator* input_validator() const;

 private:
  // (Not std::call_once: a throwing callable aborts through libstdc++'s pthread_once.)
  mutable std::mutex schema_mu_;
  mutable std::atomic<bool> schema_ready_{false};
  mutable std::optional<SchemaValidator> schema_;
};

}  // namespace machina
