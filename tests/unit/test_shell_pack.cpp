// shell_pack (shell.exec through PackRunner): what the policy refuses before anything runs
// (no shell syntax, the deny list over the allow list, a link's target, scripts whose
// interpreter is not allowed, '..', NUL, the argument cap, the working directory), and
// where the walls can be built here, a command's output, exit code, output cap and timeout.

#include <doctest/doctest.h>

#include "pack_call.hpp"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace machina;
using machina::test::call_pack;
using machina::test::check_refused;
using machina::test::PackAnswer;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

using Shell = machina::test::PackWorkspace;

/// The installed machina-toolhost (the walls' launcher), "" if there is none.
std::string launcher() {
  const fs::path p =
      fs::path(__FILE__).parent_path().parent_path().parent_path() / ".venv" / "bin" / "machina-toolhost";
  return fs::exists(p) ? fs::absolute(p).string() : "";
}

}  // namespace

TEST_CASE("without an allow list no command runs") {
  Shell s;
  PackRunner runner(s.policy, "");
  check_refused(call_pack(runner, "AID.SHELL.EXEC.v1", {{"command", "ls"}}), ErrorKind::access_denied,
                "AccessDenied: Command 'ls' is not allowed by security policy (the policy allows no command)");
}

TEST_CASE("refusals before anything runs") {
  Shell s;
  s.policy.shell.allow = {"ls", "rm", "nosuchprogram", (s.ws / "script.sh").string(), (s.tmp.path / "myls").string()};
  std::ofstream(s.ws / "script.sh") << "#!/bin/sh\necho hi\n";
  fs::permissions(s.ws / "script.sh", fs::perms::owner_all);
  fs::create_symlink("/bin/rm", s.tmp.path / "myls");
  PackRunner runner(s.policy, "");
  check_refused(call_pack(runner, "AID.SHELL.EXEC.v1", {{"command", "ls -la"}}), ErrorKind::invalid_input,
                "is not a program's name or absolute path (no shell runs here");
  check_refused(call_pack(runner, "AID.SHELL.EXEC.v1", {{"command", "ls;id"}}), ErrorKind::invalid_input,
                "is not a program's name");
  check_refused(call_pack(runner, "AID.SHELL.EXEC.v1", {{"command", "rm"}}), ErrorKind::access_denied,
                "Command 'rm' is not allowed");
  check_refused(call_pack(runner, "AID.SHELL.EXEC.v1", {{"command", "/usr/bin/../bin/ls"}}), ErrorKind::access_denied,
                "Command 'ls' is not allowed");
  check_refused(call_pack(runner, "AID.SHELL.EXEC.v1", {{"command", "cat"}}), ErrorKind::access_denied,
                "Command 'cat' is not allowed");
  check_refused(call_pack(runner, "AID.SHELL.EXEC.v1", {{"command", "nosuchprogram"}}), ErrorKind::target_not_found,
                "command nosuchprogram not found in /usr/local/bin:/usr/bin:/bin");
  // A link to a denied program is refused by its target.
  check_refused(call_pack(runner, "AID.SHELL.EXEC.v1", {{"command", (s.tmp.path / "myls").string()}}),
                ErrorKind::access_denied, "Command 'myls' is not allowed");
  check_refused(call_pack(runner, "AID.SHELL.EXEC.v1", {{"command", (s.ws / "script.sh").string()}}),
                ErrorKind::access_denied, "(it is a script run by ");
  check_refused(call_pack(runner, "AID.SHELL.EXEC.v1", {{"command", "ls"}, {"args", {std::string("a\0b", 3)}}}),
                ErrorKind::invalid_input, "an argument contains a NUL character");
  check_refused(
      call_pack(runner, "AID.SHELL.EXEC.v1", {{"command", "ls"}, {"args", std::vector<std::string>(1025, "x")}}),
      ErrorKind::invalid_input, "at most 1024 arguments of 262144 bytes in all");
  check_refused(call_pack(runner, "AID.SHELL.EXEC.v1",
                          {{"command", "ls"}, {"args", std::vector<std::string>(2, std::string(131'072, 'x'))}}),
                ErrorKind::invalid_input, "at most 1024 arguments");
  check_refused(call_pack(runner, "AID.SHELL.EXEC.v1", {{"command", "ls"}, {"cwd", "/"}}), ErrorKind::access_denied,
                "is outside the allowed directories");
  check_refused(call_pack(runner, "AID.SHELL.EXEC.v1", {{"command", "ls"}, {"cwd", "nowhere"}}),
                ErrorKind::target_not_found, "NotFound: nowhere");
  // Everything passes but the launcher of the walls is unknown (or the kernel has no walls).
  check_refused(call_pack(runner, "AID.SHELL.EXEC.v1", {{"command", "ls"}}), ErrorKind::system_error,
                "cannot be confined");
}

TEST_CASE("a command runs in its walls: output, exit code, output cap, timeout") {
  const std::string exe = launcher();
  if (exe.empty()) {
    MESSAGE("no installed machina-toolhost to launch the walls: skipped");
    return;
  }
  Shell s;
  s.policy.shell.allow = {"echo", "sh", "sleep", "head"};
  s.policy.shell.max_output_bytes = 8;
  s.policy.shell.timeout_ms = 30'000;  // a loaded machine may start the walls slowly
  PackRunner runner(s.policy, exe);
  auto a = call_pack(runner, "AID.SHELL.EXEC.v1", {{"command", "echo"}, {"args", {"hi"}}});
  if (!a.ok() && a.outcome.detail.find("cannot be confined here") != std::string::npos) {
    MESSAGE("the kernel refuses the walls here: " << a.outcome.detail);
    return;
  }
  REQUIRE_MESSAGE(a.ok(), a.outcome.detail);
  CHECK(a.output["stdout"] == "hi\n");
  CHECK(a.output["stderr"] == "");
  CHECK(a.output["exit_code"] == 0);
  CHECK(a.output["truncated"] == false);
  CHECK(a.output.contains("duration_ms"));

  a = call_pack(runner, "AID.SHELL.EXEC.v1", {{"command", "echo"}, {"args", {"0123456789abc"}}});
  REQUIRE(a.ok());
  CHECK(a.output["stdout"] == "01234567");
  CHECK(a.output["stdout_truncated"] == true);
  CHECK(a.output["truncated"] == true);

  a = call_pack(runner, "tools.shell.exec", {{"command", "sh"}, {"args", {"-c", "echo err >&2; exit 3"}}});
  REQUIRE(a.ok());
  CHECK(a.output["exit_code"] == 3);
  CHECK(a.output["stderr"] == "err\n");
  CHECK_FALSE(a.output.contains("duration_ms"));  // the subject's shape

  // The policy's timeout ends the command with its process group.
  s.policy.shell.timeout_ms = 300;
  PackRunner short_runner(s.policy, exe);
  a = call_pack(short_runner, "AID.SHELL.EXEC.v1", {{"command", "sleep"}, {"args", {"30"}}});
  CHECK(a.outcome.ending == RunOutcome::Ending::timed_out);
  CHECK(a.outcome.detail.find("its process group was killed") != std::string::npos);
}
