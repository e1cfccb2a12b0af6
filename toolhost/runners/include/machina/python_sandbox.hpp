// What confines a Python tool's workers: its manifest entry's `sandbox` and required
// guarantees, turned into the launcher that starts its interpreter inside the operating
// system's walls (isolation/sandbox_exec.hpp), what enforces each guarantee (for the call's
// trace), or why a guarantee cannot be enforced on this machine (its calls are then
// refused `guarantee_blocked`, never run unguarded). See docs/python-tools.md.
#pragma once

#include <machina/os_limits.hpp>
#include <machina/tool_manifest.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace machina {

struct SandboxPlan {
  std::vector<std::string> launcher;  // argv prefix that starts the interpreter confined; empty: none
  std::string enforcement_json;       // {guarantee: what enforces it}; "" when nothing is required
  std::string refusal;                // why its calls are refused; "" when they are not
  bool empty_environment = false;     // no_env_read: the workers get no environment at all
  std::string interpreter;            // the interpreter to start (sys.executable); "": the one given
  std::string key;                    // workers with equal keys are alike
};

/// What an interpreter says of itself, asked once and remembered: its real executable
/// (sys.executable, not a version manager's shim in front of it) and the folders of its
/// own files (its prefixes and import path), which a confined worker must be able to read.
struct InterpreterFiles {
  std::string executable;
  std::vector<std::string> paths;
};
/// Throws ConfigError when the interpreter cannot say.
InterpreterFiles interpreter_files(const std::string& interpreter);

/// `executable` is machina-toolhost (the launcher); `memory_mb` the workers' cap, watched
/// inside the sandbox. Throws ConfigError when a sandbox is needed and the interpreter cannot
/// say what it is and where its files are.
SandboxPlan plan_python_sandbox(const ManifestTool& tool, const std::string& interpreter, const std::string& executable,
                                std::uint64_t memory_mb);

/// The same for a skill's or an MCP server's process: its `sandbox`, its guarantees, its
/// memory cap and the host's OS limits (`limits`: address space, open files, file size,
/// no network; the per-call CPU budget has no meaning for a process that serves many
/// calls). `program` is the resolved path of its command's program. Throws ConfigError
/// naming what cannot be enforced here (no_filesystem_read, no_env_write, a wall this
/// machine cannot build): the process is then never started.
SandboxPlan plan_child_sandbox(const ManifestChild& child, const std::string& program, const std::string& executable,
                               const WorkerLimits& limits);

}  // namespace machina
