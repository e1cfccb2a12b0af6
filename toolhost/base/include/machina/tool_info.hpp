// What a tool says of itself: the metadata a plugin, an isolated worker, a tool manifest or a
// hosted server gives, shared by the host's registry and the worker protocol that carries it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace machina {

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

}  // namespace machina
