// See python_sandbox.hpp.
#include <machina/child_process.hpp>
#include <machina/errors.hpp>
#include <machina/isolation/sandbox_exec.hpp>
#include <machina/python_sandbox.hpp>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>

namespace machina {
namespace {

namespace fs = std::filesystem;

std::string real(const std::string& path) {
  std::error_code ec;
  const auto r = fs::canonical(path, ec);
  return ec ? path : r.string();
}

/// The lease key file (MACHINA_LEASE_KEY_FILE) is hidden from the confined process.
void hide_lease_key(sandbox::ExecSpec& spec) {
  if (const char* key_file = std::getenv("MACHINA_LEASE_KEY_FILE"); key_file != nullptr && *key_file != '\0') {
    spec.hidden_files.emplace_back(key_file);
  }
}

/// no_network: a network namespace of its own and no socket(2).
void deny_network(sandbox::ExecSpec& spec, nlohmann::ordered_json& how) {
  spec.own_network = spec.no_sockets = true;
  how["no_network"] = "a network namespace of its own (no interface up); socket(2) refused by seccomp";
}

/// With exec restricted: `program` (a resolved path) and its ELF loader alone may be executed.
void allow_exec_of_only(sandbox::ExecSpec& spec, const std::string& program) {
  spec.exec_paths = {program};
  if (auto loader = sandbox::elf_interpreter(program); !loader.empty()) spec.exec_paths.push_back(loader);
}

}  // namespace

// A sandboxed worker runs the real interpreter (a version manager's shim is a shell script
// that starts processes) and may read only its own files.
InterpreterFiles interpreter_files(const std::string& interpreter) {
  static std::mutex mu;
  static std::map<std::string, InterpreterFiles> known;
  std::lock_guard lock(mu);
  if (auto it = known.find(interpreter); it != known.end()) return it->second;
  ChildSpec spec;
  spec.executable = interpreter;
  spec.argv = {interpreter, "-I", "-c",
               "import json, sys; print(json.dumps([sys.executable, [sys.prefix, sys.base_prefix, sys.exec_prefix, "
               "sys.base_exec_prefix] + sys.path]))"};
  spec.env = pick_environment({"PATH", "HOME", "LANG", "PYENV_VERSION", "PYENV_ROOT"});
  const auto run = run_to_completion(spec, "", std::chrono::seconds(30), 1 << 20);
  InterpreterFiles files;
  if (run.ended == ChildOutcome::Ended::exited && run.exit_code == 0) {
    const auto j = nlohmann::json::parse(run.stdout_text, nullptr, false);
    if (j.is_array() && j.size() == 2 && j[0].is_string() && j[1].is_array()) {
      files.executable = j[0].get<std::string>();
      for (const auto& p : j[1]) {
        if (p.is_string() && !p.get<std::string>().empty()) files.paths.push_back(p.get<std::string>());
      }
    }
  }
  if (files.executable.empty() || files.paths.empty()) {
    throw ConfigError("the interpreter " + interpreter + " could not say where its files are (" + run.how + ")" +
                      (run.tail.empty() ? "" : ": " + run.tail));
  }
  known.emplace(interpreter, files);
  return files;
}

SandboxPlan plan_python_sandbox(const ManifestTool& tool, const std::string& interpreter, const std::string& executable,
                                std::uint64_t memory_mb) {
  SandboxPlan plan;
  auto wants = [&](const char* g) {
    auto it = tool.guarantees.find(g);
    return it != tool.guarantees.end() && it->second;
  };
  const bool net = tool.sandbox || wants("no_network");
  const bool procs = tool.sandbox || wants("no_subprocess");
  const bool write = tool.sandbox || wants("no_filesystem_write");
  const bool read = wants("no_filesystem_read");
  const bool env = wants("no_env_read");
  if (!tool.sandbox && !net && !procs && !write && !read && !env && !wants("no_env_write")) return plan;

  const sandbox::Support& support = sandbox::support();
  const InterpreterFiles files = interpreter_files(interpreter);
  plan.interpreter = files.executable;
  nlohmann::ordered_json how = nlohmann::ordered_json::object();
  std::vector<std::string> refused;
  if (wants("no_env_write")) {
    refused.push_back(
        "no_env_write cannot be enforced by the operating system (a process's environment is its own "
        "memory); no_env_read is");
  }
  if (!support.namespaces) refused.push_back("the sandbox needs " + support.namespaces_why);
  if (executable.empty()) refused.push_back("the sandbox needs the machina-toolhost executable, which was not given");
  if ((read || write) && support.landlock_abi < 1) {
    refused.push_back(
        std::string(read ? "no_filesystem_read" : "no_filesystem_write") +
        " needs Landlock, which this kernel does not offer (or MACHINA_TOOLHOST_NO_LANDLOCK=1 turned it off)");
  }

  sandbox::ExecSpec spec;
  spec.memory_mb = memory_mb;
  hide_lease_key(spec);
  if (tool.sandbox) {
    how["sandbox"] =
        "user, PID, mount and IPC namespaces of its own with a /proc of its own (no other process is "
        "visible), no capability";
  }
  if (net) deny_network(spec, how);
  if (procs) {
    spec.no_processes = true;
    spec.restrict_exec = support.landlock_abi >= 1;
    allow_exec_of_only(spec, real(files.executable));
    how["no_subprocess"] = std::string("fork, vfork, clone without CLONE_THREAD and clone3 refused by seccomp") +
                           (spec.restrict_exec ? "; executing anything but the interpreter refused by Landlock"
                                               : " (no Landlock here: the worker could still exec another program in "
                                                 "its own place, never start one)");
  }
  if (write) {
    spec.restrict_write = true;
    if (!tool.write_root.empty()) spec.write_paths.push_back(tool.write_root);
    const std::string where = tool.write_root.empty()
                                  ? std::string("to /dev/null")
                                  : "beneath " + tool.write_root + " (filesystem_root) and to /dev/null";
    how["no_filesystem_write"] =
        "Landlock: writing only " + where +
        "; every other mount read-only (no mode, time, owner or attribute changes); no set-ID bit "
        "(seccomp)";
  }
  if (read && support.landlock_abi >= 1 && refused.empty()) {
    spec.restrict_read = true;
    spec.read_paths = files.paths;
    for (const char* p :
         {"/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib", "/etc/ld.so.cache", "/etc/localtime"})
      spec.read_paths.emplace_back(p);
    spec.read_paths.push_back(tool.root);
    spec.read_paths.insert(spec.read_paths.end(), tool.read_roots.begin(), tool.read_roots.end());
    how["no_filesystem_read"] =
        "Landlock: reading only the interpreter's own files, the system libraries, the tool's "
        "directory" +
        std::string(tool.read_roots.empty() ? "" : " and filesystem_read_roots");
  }
  if (env) {
    plan.empty_environment = true;
    how["no_env_read"] = "an empty environment, and no other process's visible (a PID namespace and /proc of its own)";
  }
  if (!refused.empty()) {
    std::string why;
    for (const auto& r : refused) why += (why.empty() ? "" : "; ") + r;
    plan.refusal = why;
  }
  plan.enforcement_json = how.dump();
  plan.launcher = {executable, "--sandbox-exec", spec.to_json(), "--"};
  plan.key = spec.to_json() + (plan.empty_environment ? "\nno-env" : "");
  return plan;
}

SandboxPlan plan_child_sandbox(const ManifestChild& child, const std::string& program, const std::string& executable,
                               const WorkerLimits& limits) {
  SandboxPlan plan;
  auto wants = [&](const char* g) {
    auto it = child.guarantees.find(g);
    return it != child.guarantees.end() && it->second;
  };
  const bool net = child.sandbox || wants("no_network") || limits.no_network;
  const bool procs = child.sandbox || wants("no_subprocess");
  const bool write = child.sandbox || wants("no_filesystem_write");
  const bool env = wants("no_env_read");
  const bool rlimits = limits.address_space_mb != 0 || limits.open_files != 0 || limits.file_size_mb != 0;
  std::vector<std::string> refused;
  if (wants("no_filesystem_read")) {
    refused.push_back(
        "no_filesystem_read is not offered for a skill or an MCP server (what it may read depends on "
        "the program it runs; confine a Python tool instead)");
  }
  if (wants("no_env_write")) refused.push_back("no_env_write cannot be enforced by the operating system");
  if (!child.sandbox && !net && !procs && !write && !env && !rlimits && child.memory_mb == 0 && refused.empty()) {
    return plan;
  }
  const sandbox::Support& support = sandbox::support();
  if (!support.namespaces) refused.push_back("its walls need " + support.namespaces_why);
  if (executable.empty()) refused.push_back("its walls need the machina-toolhost executable, which was not given");
  if (write && support.landlock_abi < 1) {
    refused.push_back(
        "no_filesystem_write needs Landlock, which this kernel does not offer (or "
        "MACHINA_TOOLHOST_NO_LANDLOCK=1 turned it off)");
  }
  if (!refused.empty()) {
    std::string why;
    for (const auto& r : refused) why += (why.empty() ? "" : "; ") + r;
    throw ConfigError(why);
  }
  sandbox::ExecSpec spec;
  spec.memory_mb = child.memory_mb;
  spec.address_space_mb = limits.address_space_mb;
  spec.open_files = limits.open_files;
  spec.file_size_mb = limits.file_size_mb;
  hide_lease_key(spec);
  nlohmann::ordered_json how = nlohmann::ordered_json::object();
  if (net) deny_network(spec, how);
  if (procs) {
    spec.no_processes = true;
    spec.restrict_exec = support.landlock_abi >= 1;
    allow_exec_of_only(spec, real(program));
    how["no_subprocess"] = "fork, vfork, clone without CLONE_THREAD and clone3 refused by seccomp";
  }
  if (write) {
    spec.restrict_write = true;
    if (!child.write_root.empty()) spec.write_paths.push_back(child.write_root);
    how["no_filesystem_write"] = "Landlock: writing only to /dev/null" +
                                 std::string(child.write_root.empty() ? "" : " and beneath filesystem_root") +
                                 "; every other mount read-only (no mode, time, owner or attribute changes); no set-ID "
                                 "bit (seccomp)";
  }
  if (env) {
    plan.empty_environment = true;
    how["no_env_read"] = "an empty environment, and no other process's visible";
  }
  plan.enforcement_json = how.dump();
  plan.launcher = {executable, "--sandbox-exec", spec.to_json(), "--"};
  plan.key = spec.to_json();
  return plan;
}

}  // namespace machina
