// The tools a host knows, each with its metadata and its runner: registered from plugin
// libraries or a plugin linked into the program through the C ABI (version checked before
// anything is registered), or from descriptions (tools whose code is elsewhere, e.g. in an
// isolated worker). A batch of tools is registered whole or not at all.
#pragma once

#include <machina/tool.hpp>
#include <machina/tool_names.hpp>

#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace machina {

/// A plugin's two C entry points (see plugin_abi.h).
struct PluginEntryPoints {
  machina_plugin_abi_version_fn abi_version = nullptr;
  machina_plugin_register_fn register_tools = nullptr;
};

/// What `ToolInfo::plugin_path` says of tools linked into the program.
inline constexpr std::string_view kLinkedPluginSource = "built-in";

/// Thread-safe: lookups may run while another thread loads a plugin.
class ToolRegistry {
 public:
  explicit ToolRegistry(CircuitBreaker::Options breaker_options);
  ~ToolRegistry();
  ToolRegistry(const ToolRegistry&) = delete;
  ToolRegistry& operator=(const ToolRegistry&) = delete;

  /// Loads a plugin library and registers its tools, run by `runner`. Throws ConfigError
  /// naming the file if it cannot be opened, lacks an entry point, has another ABI
  /// version, declares an invalid tool or an aid that is already registered. Returns the
  /// aids added. Defined apart (plugin_library.cpp), so that a program which only links
  /// its tools in carries no dynamic loading.
  std::vector<std::string> load_plugin(const std::string& path, Runner* runner);

  /// Registers the tools of a plugin whose entry points are at hand; `source` names it
  /// in errors and in each tool's plugin_path. Same checks and errors as load_plugin
  /// (the ABI version first, then the register entry point, which may be null).
  std::vector<std::string> add_plugin(const std::string& source, PluginEntryPoints entry, Runner* runner);

  /// Registers tools from their descriptions alone (their code runs elsewhere, through
  /// `runner`). The same checks as for a plugin (aid, tier, schema, duplicates); all or
  /// none. Throws ConfigError naming `source`. `host_own`: the host's own tools (the packs),
  /// whose schemas are checked at their first call (see Tool::compile_schema).
  std::vector<std::string> add_described(const std::string& source, std::vector<ToolInfo> tools, Runner* runner,
                                         bool host_own = false);

  /// A tool known by its description, with the runner that runs it.
  struct Described {
    ToolInfo info;
    Runner* runner = nullptr;
    bool host_own = false;
  };
  /// Registers tools each with a runner of its own (a tool manifest's), all or none, with
  /// the checks above. Errors name "`what` `source`" (e.g. "tool manifest tools.toml").
  std::vector<std::string> add_described(const std::string& source, std::vector<Described> tools,
                                         std::string_view what);

  /// The tool, or nullptr. The pointer stays valid for the registry's lifetime.
  const Tool* find(std::string_view aid) const;

  /// The tool a caller's name stands for, in every front (tool_names.hpp): its aid, else its
  /// LLM function name, else a display name no other tool has. nullptr if none; `sharing`
  /// (if given) then holds the aids of the tools whose display name it is, when several.
  const Tool* resolve(std::string_view name, std::vector<std::string>* sharing = nullptr) const;
  /// The function name the LLM formats declare `tool` under (unique in this registry).
  std::string llm_name(const Tool& tool) const;

  std::vector<ToolInfo> list() const;
  /// The registered tools in registration order (pointers valid for the registry's life).
  std::vector<const Tool*> tools() const;
  std::size_t size() const;

 private:
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  /// `host_own`: the tools are the host's built-ins (the packs), whose names no later tool
  /// may take.
  std::vector<std::string> add(const std::string& where, std::vector<std::unique_ptr<Tool>> tools,
                               bool host_own = false);
  /// Why `tool` may not be registered under its aid or name ("" if it may): its aid or its
  /// name is a built-in tool's name, or its aid is a name another tool answers to (`batch`:
  /// the names of the tools registered with it). Under mu_.
  std::string name_taken(const Tool& tool, const std::unordered_map<std::string_view, const Tool*>& batch) const;

  CircuitBreaker::Options breaker_options_;
  // Unique for the life of the process (unlike the registry's address): names this
  // registry in each thread's last lookup (see find()).
  std::uint64_t serial_;
  mutable std::shared_mutex mu_;
  std::unordered_map<std::string, std::unique_ptr<Tool>, Hash, std::equal_to<>> tools_;
  std::vector<std::string> order_;
  // The first tool registered under each name (fronts that call by name look names up).
  std::unordered_map<std::string, const Tool*, Hash, std::equal_to<>> by_name_;
  // The built-in tools by name (another name of one, such as readFile, is a tool too).
  std::unordered_map<std::string, const Tool*, Hash, std::equal_to<>> built_in_names_;
  // The names the tools answer to besides their aids, rebuilt at each registration.
  ToolNames names_;
  // Opened plugin libraries, closed after tools_ is cleared (the closer comes with them).
  std::vector<std::unique_ptr<void, int (*)(void*)>> libraries_;
};

}  // namespace machina
