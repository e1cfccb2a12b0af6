// A tool as the host knows it: its metadata (ToolInfo: from a plugin, a worker that loaded
// one, a tool manifest or a hosted server), its compiled input schema, its breaker, and the
// runner that runs its calls. Native plugin tools also carry their C entry point.
#pragma once

#include <machina/plugin_abi.h>
#include <machina/circuit_breaker.hpp>
#include <machina/schema_validator.hpp>
#include <machina/tool_info.hpp>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace machina {

class Runner;

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

  /// Checks `info.input_schema` now (throws ConfigError if the host cannot check it), or,
  /// with `defer`, at the tool's first call: the host's own tools (the packs, plugins
  /// linked into the program) are not checked at every start of a `--run` process; a
  /// unit test compiles every one of their schemas instead.
  void compile_schema(bool defer);
  /// The input schema to check a call against, or null if the tool declares none.
  /// Thread-safe. Throws ConfigError if a deferred schema does not compile.
  const SchemaValidator* input_validator() const;

 private:
  // (Not std::call_once: a throwing callable aborts through libstdc++'s pthread_once.)
  mutable std::mutex schema_mu_;
  mutable std::atomic<bool> schema_ready_{false};
  mutable std::optional<SchemaValidator> schema_;
};

}  // namespace machina
