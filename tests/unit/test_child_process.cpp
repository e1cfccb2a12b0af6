// ChildProcess: the one supervisor of child processes (own process group, bounded tail
// of its output, exit described in words, killed with its group, reaped).
#include <machina/child_process.hpp>

#include <doctest/doctest.h>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <thread>

using namespace machina;

namespace {
// Long enough that only a hang reaches it, however loaded the machine: the tests assert
// what happened and in which order, not how fast.
constexpr std::chrono::seconds kGuard{60};

/// Calls `step` until it returns true or kGuard passes: whether it returned true.
template <class Step>
bool eventually(Step step) {
  const auto give_up = std::chrono::steady_clock::now() + kGuard;
  while (!step()) {
    if (std::chrono::steady_clock::now() >= give_up) return false;
  }
  return true;
}

ChildSpec shell(const std::string& script, std::size_t tail_bytes = 2048) {
  ChildSpec spec;
  spec.executable = "/bin/sh";
  spec.argv = {"sh", "-c", script};
  spec.env = {"PATH=/usr/bin:/bin"};
  spec.tail_bytes = tail_bytes;
  return spec;
}

void drain_until_closed(ChildProcess& child) {
  CHECK(eventually([&] {
    pollfd fd{child.output_fd(), POLLIN, 0};
    ::poll(&fd, 1, 10);
    return !child.read_output();
  }));
}
}  // namespace

TEST_CASE("the child's end is described in words") {
  ChildProcess exits(shell("exit 3"));
  drain_until_closed(exits);
  CHECK(exits.end() == "exited with status 3");
  CHECK(exits.ended());
  ChildProcess killed(shell("kill -SEGV $$"));
  drain_until_closed(killed);
  CHECK(killed.end() == "was killed by signal 11 (SIGSEGV: Segmentation fault)");
  CHECK(describe_wait_status(0) == "exited with status 0");
}

TEST_CASE("only the tail of the child's output is kept, whole characters only") {
  ChildProcess child(
      shell("i=0; while [ $i -lt 300 ]; do printf 'line %03d\\n' $i; i=$((i+1)); done; printf 'LAST'", 64));
  drain_until_closed(child);
  const std::string tail = child.tail();
  CHECK(tail.size() <= 64);
  CHECK(tail.size() > 0);
  CHECK(tail.substr(tail.size() - 4) == "LAST");
  child.end();
}

TEST_CASE("end() kills the child's whole process group and exited() does not reap") {
  ChildProcess child(shell("sleep 300 & echo $! ; wait"));
  CHECK(getpgid(child.pid()) == child.pid());  // a group of its own
  CHECK_FALSE(child.exited());
  std::string out;
  REQUIRE(eventually([&] {
    pollfd fd{child.output_fd(), POLLIN, 0};
    ::poll(&fd, 1, 10);
    child.read_output();
    out = child.tail();
    return out.find('\n') != std::string::npos;
  }));
  const pid_t grandchild = std::stoi(out);
  CHECK(child.end() == "was killed by signal 9 (SIGKILL: Killed)");
  // Killed with the group (a zombie until its reaper comes), long before its sleep ends.
  CHECK(eventually([&] {
    std::ifstream stat("/proc/" + std::to_string(grandchild) + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    if (text.empty() || text.substr(text.rfind(')') + 2, 1) == "Z") return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return false;
  }));
}

TEST_CASE("pick_environment passes only the named variables that are set") {
  ::setenv("MACHINA_UNIT_A", "1", 1);
  ::unsetenv("MACHINA_UNIT_B");
  CHECK(pick_environment({"MACHINA_UNIT_A", "MACHINA_UNIT_B"}) == std::vector<std::string>{"MACHINA_UNIT_A=1"});
}

TEST_CASE("pids stay known after end, and kill() never signals a reaped child") {
  ChildProcess child(shell("exit 0"));
  const pid_t pid = child.pid();
  CHECK(child.wait_exit(kGuard));
  child.end();
  CHECK(child.pid() == pid);
  CHECK(child.exit_code() == 0);
  child.kill();  // nothing to signal: no error, no stray signal
  CHECK(child.ended());
}

TEST_CASE("with Stdio::pipes the caller has stdin and stdout, and stderr goes to the tail") {
  ChildSpec spec = shell("read line; echo \"got $line\"; echo oops >&2; exit 4");
  spec.stdio = ChildSpec::Stdio::pipes;
  ChildProcess child(spec);
  child.drain_in_background();
  const std::string hello = "hello\n";
  CHECK(::write(child.input_fd(), hello.data(), hello.size()) == static_cast<ssize_t>(hello.size()));
  child.close_input();
  std::string out;
  CHECK(eventually([&] {
    pollfd fd{child.stdout_fd(), POLLIN, 0};
    ::poll(&fd, 1, 10);
    char buf[256];
    const ssize_t n = ::read(child.stdout_fd(), buf, sizeof buf);
    if (n > 0) out.append(buf, static_cast<std::size_t>(n));
    return n == 0;
  }));
  CHECK(out == "got hello\n");
  CHECK(child.wait_exit(kGuard));
  CHECK(child.end(1000) == "exited with status 4");
  CHECK(child.exit_code() == 4);
  CHECK(child.tail() == "oops\n");
}

TEST_CASE("wait_exit gives up at its limit and does not reap") {
  ChildProcess child(shell("sleep 300"));
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(child.wait_exit(std::chrono::milliseconds(50)));
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(45));
  CHECK_FALSE(child.exited());
  CHECK(child.end() == "was killed by signal 9 (SIGKILL: Killed)");
  CHECK(child.exit_code() == -9);
}

TEST_CASE("run_to_completion: input in, output out, the stderr tail kept") {
  const ChildOutcome r = run_to_completion(shell("cat; echo err >&2; exit 2"), "request\n", kGuard, 1024);
  CHECK(r.ended == ChildOutcome::Ended::exited);
  CHECK(r.stdout_text == "request\n");
  CHECK(r.exit_code == 2);
  CHECK(r.how == "exited with status 2");
  CHECK(r.tail == "err\n");
}

TEST_CASE("run_to_completion kills the group at its deadline and past its output cap") {
  const auto t0 = std::chrono::steady_clock::now();
  const ChildOutcome late = run_to_completion(shell("sleep 300 & wait"), "", std::chrono::milliseconds(200), 1024);
  CHECK(late.ended == ChildOutcome::Ended::timed_out);
  CHECK(late.exit_code == -9);
  // Not waited for: the group was killed at the deadline, long before the sleep would end.
  CHECK(std::chrono::steady_clock::now() - t0 < kGuard);
  const ChildOutcome big = run_to_completion(shell("yes"), "", kGuard, 100000);
  CHECK(big.ended == ChildOutcome::Ended::output_over_cap);
  CHECK(big.stdout_text.size() > 100000);
  CHECK(big.stdout_text.size() <= 100000 + 65536);
}

TEST_CASE("run_to_completion survives a child that does not read its input") {
  // Far more than a pipe holds, to a child that exits without reading: EPIPE, no SIGPIPE.
  const std::string input(1 << 20, 'x');
  const ChildOutcome r = run_to_completion(shell("exit 0"), input, kGuard, 1024);
  CHECK(r.ended == ChildOutcome::Ended::exited);
  CHECK(r.exit_code == 0);
}

TEST_CASE("a child that cannot be started is a StartError with its errno") {
  ChildSpec spec = shell("true");
  spec.executable = "/nonexistent/machina-unit";
  try {
    ChildProcess child(spec);
    FAIL("started");
  } catch (const StartError& e) {
    CHECK(e.error == ENOENT);
  }
}
