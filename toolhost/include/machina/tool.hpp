// A tool as the host knows it: its metadata (from a plugin or a worker that loaded one;
// later from a tool manifest), its compiled input schema, its breaker, and the runner that
// runs its calls. Native plugin tools also carry their C entry point.
#pragma once

#include <machina/circuit_breaker.hpp>
#include <machina/plugin_abi.h>
#include <machina/schema_validator.hpp>

#include <cstdint>
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
  std::string output_schema;   // JSON text
  std::string annotations;     // JSON object text (MCP's readOnlyHint, destructiveHint ...)
  // The input schema listed for a tool whose schema the host does not check (it uses
  // keywords the host's validator does not have; the tool checks its input itself).
  std::string listed_schema;
  // Another name of the tool `alias_of` (a pack tool's seed names), answering in the
  // seed's shapes; fronts that list tools for a model list only the primary name.
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
  std::optional<SchemaValidator> schema;
  Runner* runner = nullptr;  // how its calls run (owned by the host; null in a worker)
  machina_tool_fn invoke = nullptr;
  void* tool_data = nullptr;
  mutable CircuitBreaker breaker;

  explicit Tool(const CircuitBreaker::Options& breaker_options) : breaker(breaker_options) {}
};

}  // namespace machina
