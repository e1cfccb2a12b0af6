// sandbox_exec (a program confined by the operating system): the spec's JSON round trip and
// its refusals, the ELF interpreter of a program, resident memory, what support() probes,
// and, where this kernel builds the walls, a program run in them: its output and exit
// status, sockets and new processes refused, writes only beneath write_paths, a program
// not in exec_paths never runs.
#include <machina/errors.hpp>
#include <machina/isolation/sandbox_exec.hpp>

#include <doctest/doctest.h>

#include "temp_dir.hpp"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace machina;
using namespace machina::sandbox;
namespace fs = std::filesystem;

namespace {

struct Ran {
  int status = -1;
  std::string out;  // stdout and stderr
};

/// exec_in_sandbox in a child process, its output caught.
Ran run_confined(const ExecSpec& spec, std::vector<std::string> argv) {
  int pipe_fds[2];
  REQUIRE(pipe(pipe_fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(pipe_fds[1], 1);
    dup2(pipe_fds[1], 2);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    _exit(exec_in_sandbox(spec, args.data()));
  }
  close(pipe_fds[1]);
  Ran ran;
  char buf[4096];
  for (ssize_t n; (n = read(pipe_fds[0], buf, sizeof buf)) > 0;) ran.out.append(buf, static_cast<std::size_t>(n));
  close(pipe_fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  ran.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return ran;
}

std::string real(const char* path) {
  return fs::canonical(path).string();
}

}  // namespace

TEST_CASE("a spec round trips through its JSON") {
  ExecSpec s;
  s.own_network = true;
  s.no_sockets = true;
  s.no_processes = true;
  s.restrict_read = true;
  s.restrict_write = true;
  s.restrict_exec = true;
  s.read_paths = {"/usr"};
  s.write_paths = {"/tmp/w"};
  s.exec_paths = {"/usr/bin/echo"};
  s.no_exec_paths = {"/usr/bin"};
  s.hidden_files = {"/etc/key"};
  s.memory_mb = 1;
  s.write_quota_mb = 2;
  s.address_space_mb = 3;
  s.open_files = 4;
  s.file_size_mb = 5;
  s.cpu_seconds = 6;
  const ExecSpec back = ExecSpec::from_json(s.to_json());
  CHECK(back.to_json() == s.to_json());
  CHECK(back.exec_paths == s.exec_paths);
  CHECK(back.cpu_seconds == 6);
  CHECK(back.write_quota_mb == 2);
}

TEST_CASE("a spec that is not one is refused") {
  CHECK_THROWS_WITH_AS(ExecSpec::from_json("{"), doctest::Contains("not a sandbox spec"), ConfigError);
  CHECK_THROWS_WITH_AS(ExecSpec::from_json("{}"), doctest::Contains("not a sandbox spec"), ConfigError);
  nlohmann::json j = nlohmann::json::parse(ExecSpec{}.to_json());
  j["memory_mb"] = "lots";
  CHECK_THROWS_AS(ExecSpec::from_json(j.dump()), ConfigError);
  j = nlohmann::json::parse(ExecSpec{}.to_json());
  j.erase("no_exec_paths");  // the optional fields take their defaults
  j.erase("write_quota_mb");
  j.erase("cpu_seconds");
  CHECK(ExecSpec::from_json(j.dump()).to_json() == ExecSpec{}.to_json());
}

TEST_CASE("a program's ELF interpreter, none for a script or a missing file") {
  const std::string loader = elf_interpreter(real("/bin/ls"));
  REQUIRE_FALSE(loader.empty());
  CHECK(fs::exists(loader));
  CHECK(loader == fs::canonical(loader).string());
  TempDir tmp;
  const std::string script = (tmp.path / "s.sh").string();
  std::ofstream(script) << "#!/bin/sh\n";
  CHECK(elf_interpreter(script).empty());
  CHECK(elf_interpreter((tmp.path / "none").string()).empty());
}

TEST_CASE("resident memory of a process, 0 for one that is not there") {
  CHECK(resident_mb(getpid()) > 0);
  CHECK(resident_mb(-5) == 0);
}

TEST_CASE("no program to run is a failure to confine") {
  char* none[] = {nullptr};
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const int null_fd = open("/dev/null", O_WRONLY);
    dup2(null_fd, 2);  // (it says why on stderr)
    _exit(exec_in_sandbox(ExecSpec{}, none));
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WEXITSTATUS(status) == 126);
}

TEST_CASE("a program in its walls") {
  if (!support().namespaces) {
    CHECK_FALSE(support().namespaces_why.empty());
    MESSAGE("no walls here: " << support().namespaces_why);
    return;
  }
  TempDir tmp;
  fs::create_directories(tmp.path / "w");
  ExecSpec s;
  s.own_network = s.no_sockets = s.no_processes = true;
  Ran r = run_confined(s, {real("/bin/echo"), "hello"});
  CHECK(r.status == 0);
  CHECK(r.out == "hello\n");
  r = run_confined(s, {real("/bin/sh"), "-c", "exit 7"});
  CHECK(r.status == 7);
  // No new process: the shell cannot start `true`'s process.
  r = run_confined(s, {real("/bin/sh"), "-c", "/bin/true && echo started"});
  CHECK(r.out.find("started") == std::string::npos);

  if (support().landlock_abi < 1) {
    MESSAGE("no Landlock here: the read, write and exec walls are not tested");
    return;
  }
  s.restrict_write = s.restrict_exec = true;
  s.write_paths = {(tmp.path / "w").string()};
  s.exec_paths = {real("/bin/sh")};
  if (const std::string loader = elf_interpreter(real("/bin/sh")); !loader.empty()) s.exec_paths.push_back(loader);
  r = run_confined(s, {real("/bin/sh"), "-c",
                       "echo a > " + (tmp.path / "w" / "in").string() + " && echo b > " + (tmp.path / "out").string()});
  CHECK(r.status != 0);
  CHECK(fs::exists(tmp.path / "w" / "in"));
  CHECK_FALSE(fs::exists(tmp.path / "out"));
  r = run_confined(s, {real("/bin/echo"), "never"});
  CHECK(r.out.find("never\n") == std::string::npos);
  CHECK(r.status != 0);
}
