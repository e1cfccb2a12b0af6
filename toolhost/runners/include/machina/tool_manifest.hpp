// Tool manifests: TOML files that declare tools whose code is not a C-ABI plugin (Python
// tools, HTTP tool services; later skills and MCP servers), each with its metadata and the
// fields of the runner it needs (docs/python-tools.md#the-manifest). Loading checks every
// field's type and shape and refuses a bad manifest whole, naming file, line and field;
// registering the tools with their runners is the host's part.
#pragma once

#include <machina/tool.hpp>

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace machina {

struct ManifestTool {
  ToolInfo info;         // aid, name, description, input_schema (JSON text), tier, deterministic,
                         // side_effects, tags, default_timeout_ms; plugin_path = the manifest's path
  std::string runner;    // "python", "service" or "container"
  std::size_t line = 0;  // where its [[tool]] table starts
  // runner = "python" (and "container")
  std::string entry;        // "module:function"
  std::string python;       // the interpreter to run it with (default "python3")
  std::string root;         // the manifest's directory: Python modules resolve from it; a service's app_root
  std::string deps_source;  // what declares root's dependencies (deps_source_of); python tools only
  bool sandbox = false;
  std::size_t workers = 0;              // its interpreter's workers (0: the host's default)
  std::uint64_t memory_mb = 0;          // a worker resident past this is replaced; a container's limit
                                        // (0: the host's default)
  std::vector<std::string> env;         // variables of the host's environment its workers also get
  std::vector<std::string> read_roots;  // filesystem_read_roots: readable under no_filesystem_read (absolute)
  std::string write_root;               // filesystem_root: writable under no_filesystem_write ("" for none)
  // runner = "service"
  std::string url;               // http:// or https://
  bool unsafe_override = false;  // call even when the service does not cover the guarantees
  std::string token_env;         // the variable holding its bearer token ("" for none)
  std::string ca_file;           // https: the CAs its certificate is verified against ("": the system's)
  // runner = "container" (container_runner.hpp)
  std::string image;
  std::vector<std::string> command;                                // empty: the protocol's runner module
  std::string container_runtime;                                   // "podman", "docker"; "": the first found
  std::vector<std::pair<std::string, std::string>> container_env;  // set in the container
  // Every runner: the capability guarantees the tool requires (name -> required).
  std::map<std::string, bool> guarantees;
  // A tool of a namel3ss pack (pack_manifest.hpp): the pack, for its trace.
  struct Pack {
    std::string source;  // "installed_pack" ("": not a pack's tool)
    std::string id, name, version;
    std::string bindings_path;  // its tools.yaml (`line` is its binding's line there)
  } pack;
};

/// A skill ([[skill]], or a skill directory) or an MCP server ([[mcp_server]]): a child
/// process spoken to in JSON-RPC whose tools are asked of it when it starts.
struct ManifestChild {
  std::string kind;  // "skill" or "mcp_server"
  std::string name;  // names its tools' aids (AID.SKILL.<NAME>.<TOOL>.v1)
  std::size_t line = 0;
  std::vector<std::string> command;  // the program and its arguments (none for a server reached by `url`)
  // An MCP server reached over Streamable HTTP instead of started (remote_mcp_server.hpp).
  std::string url;                                           // http:// or https://
  std::string token_env;                                     // the variable holding its bearer token ("": none)
  std::string ca_file;                                       // https: its CAs ("": the system's)
  std::vector<std::pair<std::string, std::string>> headers;  // sent with every request
  std::string dir;  // its working directory (absolute): the manifest's, or `dir`
  std::string description;
  std::string methods = "lifecycle";  // skills: "lifecycle" (lifecycle/* and shutdown) or "skill" (skill/*)
  std::int64_t tick_interval_ms =
      -1;                  // skills: lifecycle/onTick this often (0: never; -1: not said: the host's default)
  std::string data_dir;    // skills: where data/read and data/write go ("": a default)
  std::string aid_prefix;  // "": AID.SKILL.<NAME>. or AID.MCP.<NAME>.
  std::int64_t start_timeout_ms = 30'000;
  ToolInfo defaults;  // tier, deterministic, side effects, tags, deadline of each of its tools
  std::map<std::string, bool> guarantees;
  bool sandbox = false;
  std::uint64_t memory_mb = 0;
  std::vector<std::string> env;        // variables of the host's environment it also gets (the operator's list)
  std::vector<std::string> skill_env;  // what a skill directory's manifest.json asks for: passed only if in `env`
  std::string write_root;
  std::string skill_manifest_json;  // a skill directory's manifest.json (skill/load's `manifest`)
  bool skill_requirements = false;  // the skill directory holds a requirements.txt (skill_environment.hpp)
};

struct ToolManifest {
  std::string path;
  std::vector<ManifestTool> tools;
  std::vector<ManifestChild> children;
};

/// The guarantees a manifest may name.
const std::vector<std::string>& known_guarantees();

/// What declares the dependencies of the Python code in `folder`: "pyproject" (a
/// pyproject.toml), "requirements" (a requirements.txt) or "none". The host installs none
/// of them: a tool's trace reports it.
std::string deps_source_of(const std::string& folder);

/// Loads and checks a manifest, a skill directory (manifest.json and SKILL.md: docs/mcp-and-skills.md
/// lays it out) or a namel3ss pack (a directory with pack.yaml: pack_manifest.hpp).
/// Throws ConfigError "FILE:LINE: …" naming the field at fault (a TOML
/// syntax error, an unknown key, a missing or mistyped field, a runner this build does not
/// have, an aid or a name declared twice in the file).
ToolManifest load_tool_manifest(const std::string& path);

/// The same, from text (`path` names it in errors; relative module roots resolve from its
/// directory).
ToolManifest parse_tool_manifest(std::string_view text, const std::string& path);

}  // namespace machina
