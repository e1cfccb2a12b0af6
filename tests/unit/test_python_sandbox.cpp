// python_sandbox (what confines a Python tool's workers and a skill's or MCP server's
// process): nothing required, no launcher; each guarantee turns into its wall in the
// launcher's spec and is named in the enforcement; what cannot be enforced is refused
// (a Python tool's calls) or thrown (a child process); what the interpreter says of itself.
#include <machina/errors.hpp>
#include <machina/isolation/sandbox_exec.hpp>
#include <machina/python_sandbox.hpp>

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

using namespace machina;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kPython = "/usr/bin/python3";
const std::string kLauncher = "/opt/machina-toolhost";

/// The sandbox spec a plan's launcher carries.
sandbox::ExecSpec spec_of(const SandboxPlan& plan) {
  REQUIRE(plan.launcher.size() == 4);
  CHECK(plan.launcher[0] == kLauncher);
  CHECK(plan.launcher[1] == "--sandbox-exec");
  CHECK(plan.launcher[3] == "--");
  return sandbox::ExecSpec::from_json(plan.launcher[2]);
}

}  // namespace

TEST_CASE("what the interpreter says of itself") {
  if (!fs::exists(kPython)) {
    MESSAGE("no " << kPython << ": skipped");
    return;
  }
  const InterpreterFiles files = interpreter_files(kPython);
  CHECK(fs::exists(files.executable));
  CHECK_FALSE(files.paths.empty());
  CHECK_THROWS_WITH_AS(interpreter_files("/bin/false"), doctest::Contains("could not say where its files are"),
                       ConfigError);
  CHECK_THROWS_AS(interpreter_files("/nonexistent/python"), ConfigError);
}

TEST_CASE("a Python tool that requires nothing runs without walls") {
  ManifestTool tool;
  const SandboxPlan plan = plan_python_sandbox(tool, kPython, kLauncher, 512);
  CHECK(plan.launcher.empty());
  CHECK(plan.enforcement_json.empty());
  CHECK(plan.refusal.empty());
  CHECK_FALSE(plan.empty_environment);
}

TEST_CASE("a Python tool's guarantees become walls, each named with what enforces it") {
  if (!fs::exists(kPython)) {
    MESSAGE("no " << kPython << ": skipped");
    return;
  }
  ManifestTool tool;
  tool.root = "/srv/tool";
  tool.write_root = "/srv/out";
  tool.guarantees = {{"no_network", true},
                     {"no_subprocess", true},
                     {"no_filesystem_write", true},
                     {"no_env_read", true},
                     {"no_filesystem_read", false}};
  const SandboxPlan plan = plan_python_sandbox(tool, kPython, kLauncher, 256);
  const sandbox::ExecSpec spec = spec_of(plan);
  CHECK(spec.own_network);
  CHECK(spec.no_sockets);
  CHECK(spec.no_processes);
  CHECK(spec.restrict_write);
  CHECK_FALSE(spec.restrict_read);
  CHECK(spec.write_paths == std::vector<std::string>{"/srv/out"});
  CHECK(spec.memory_mb == 256);
  REQUIRE_FALSE(spec.exec_paths.empty());
  CHECK(spec.exec_paths[0] == fs::canonical(interpreter_files(kPython).executable).string());
  CHECK(plan.empty_environment);
  CHECK(plan.interpreter == interpreter_files(kPython).executable);
  const json how = json::parse(plan.enforcement_json);
  for (const char* g : {"no_network", "no_subprocess", "no_filesystem_write", "no_env_read"}) {
    CAPTURE(g);
    CHECK(how.contains(g));
  }
  CHECK(how["no_filesystem_write"].get<std::string>().find("beneath /srv/out") != std::string::npos);
  CHECK_FALSE(how.contains("no_filesystem_read"));
  const auto& support = sandbox::support();
  CHECK(plan.refusal.empty() == (support.namespaces && support.landlock_abi >= 1));
  // Plans alike share a key; a different environment makes a different one.
  CHECK(plan_python_sandbox(tool, kPython, kLauncher, 256).key == plan.key);
  tool.guarantees["no_env_read"] = false;
  CHECK(plan_python_sandbox(tool, kPython, kLauncher, 256).key != plan.key);
}

TEST_CASE("what cannot be enforced refuses a Python tool's calls, saying why") {
  if (!fs::exists(kPython)) {
    MESSAGE("no " << kPython << ": skipped");
    return;
  }
  ManifestTool tool;
  tool.guarantees = {{"no_env_write", true}};
  SandboxPlan plan = plan_python_sandbox(tool, kPython, kLauncher, 0);
  CHECK(plan.refusal.find("no_env_write cannot be enforced by the operating system") != std::string::npos);
  tool.guarantees = {{"no_network", true}};
  plan = plan_python_sandbox(tool, kPython, "", 0);
  CHECK(plan.refusal.find("the sandbox needs the machina-toolhost executable") != std::string::npos);
  // sandbox = true alone: network, processes and writes walled.
  tool.guarantees.clear();
  tool.sandbox = true;
  plan = plan_python_sandbox(tool, kPython, kLauncher, 0);
  const sandbox::ExecSpec spec = spec_of(plan);
  CHECK(spec.own_network);
  CHECK(spec.no_processes);
  CHECK(spec.restrict_write);
  CHECK(spec.write_paths.empty());
  CHECK(json::parse(plan.enforcement_json).contains("sandbox"));
}

TEST_CASE("a child process: nothing asked, no walls, what cannot be enforced is thrown") {
  ManifestChild child;
  CHECK(plan_child_sandbox(child, "/bin/cat", kLauncher, WorkerLimits{}).launcher.empty());
  child.guarantees = {{"no_filesystem_read", true}};
  CHECK_THROWS_WITH_AS(plan_child_sandbox(child, "/bin/cat", kLauncher, WorkerLimits{}),
                       doctest::Contains("no_filesystem_read is not offered for a skill or an MCP server"),
                       ConfigError);
  child.guarantees = {{"no_env_write", true}};
  CHECK_THROWS_WITH_AS(plan_child_sandbox(child, "/bin/cat", kLauncher, WorkerLimits{}),
                       doctest::Contains("no_env_write cannot be enforced"), ConfigError);
  child.guarantees = {{"no_network", true}};
  CHECK_THROWS_WITH_AS(plan_child_sandbox(child, "/bin/cat", "", WorkerLimits{}),
                       doctest::Contains("its walls need the machina-toolhost executable"), ConfigError);
}

TEST_CASE("a child process's walls and the host's limits") {
  if (!sandbox::support().namespaces || sandbox::support().landlock_abi < 1) {
    MESSAGE("no walls here: the planned walls of a child are not tested");
    return;
  }
  ManifestChild child;
  child.memory_mb = 64;
  child.write_root = "/srv/state";
  child.guarantees = {{"no_subprocess", true}, {"no_filesystem_write", true}, {"no_env_read", true}};
  WorkerLimits limits;
  limits.no_network = true;
  limits.open_files = 99;
  limits.address_space_mb = 1024;
  limits.file_size_mb = 7;
  const SandboxPlan plan = plan_child_sandbox(child, "/bin/cat", kLauncher, limits);
  const sandbox::ExecSpec spec = spec_of(plan);
  CHECK(spec.own_network);
  CHECK(spec.no_processes);
  CHECK(spec.restrict_write);
  CHECK(spec.write_paths == std::vector<std::string>{"/srv/state"});
  CHECK(spec.memory_mb == 64);
  CHECK(spec.open_files == 99);
  CHECK(spec.address_space_mb == 1024);
  CHECK(spec.file_size_mb == 7);
  CHECK(spec.exec_paths[0] == fs::canonical("/bin/cat").string());
  CHECK(plan.empty_environment);
  // Limits alone are enough for a launcher.
  const SandboxPlan limited = plan_child_sandbox(ManifestChild{}, "/bin/cat", kLauncher, limits);
  CHECK(spec_of(limited).open_files == 99);
}
