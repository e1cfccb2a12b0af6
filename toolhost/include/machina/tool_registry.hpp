// The tools a host knows, and the loader that registers them from plugin libraries
// through the C ABI (version checked before anything is registered; a plugin is
// registered whole or not at all).
#pragma once

#include <machina/circuit_breaker.hpp>
#include <machina/schema_validator.hpp>
#include <machina/plugin_abi.h>

#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
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
  std::string plugin_path;
};

struct Tool {
  ToolInfo info;
  std::optional<SchemaValidator> schema;
  machina_tool_fn invoke = nullptr;
  void* tool_data = nullptr;
  mutable CircuitBreaker breaker;

  explicit Tool(const CircuitBreaker::Options& breaker_options) : breaker(breaker_options) {}
};

/// Thread-safe: lookups may run while another thread loads a plugin.
class ToolRegistry {
 public:
  explicit ToolRegistry(CircuitBreaker::Options breaker_options) : breaker_options_(breaker_options) {}
  ~ToolRegistry();
  ToolRegistry(const ToolRegistry&) = delete;
  ToolRegistry& operator=(const ToolRegistry&) = delete;

  /// Loads a plugin library and registers its tools. Throws HostError naming the file
  /// if it cannot be opened, lacks an entry point, has another ABI version, declares
  /// an invalid tool or an aid that is already registered. Returns the aids added.
  std::vector<std::string> load_plugin(const std::string& path);

  /// The tool, or nullptr. The pointer stays valid for the registry's lifetime.
  const Tool* find(std::string_view aid) const;

  std::vector<ToolInfo> list() const;
  std::size_t size() const;

 private:
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  CircuitBreaker::Options breaker_options_;
  mutable std::shared_mutex mu_;
  std::unordered_map<std::string, std::unique_ptr<Tool>, Hash, std::equal_to<>> tools_;
  std::vector<std::string> order_;
  std::vector<void*> libraries_;
};

}  // namespace machina
