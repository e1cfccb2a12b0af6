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
ChildSpec shell(const std::string& script, std::size_t tail_bytes = 2048) {
  ChildSpec spec;
  spec.executable = "/bin/sh";
  spec.argv = {"sh", "-c", script};
  spec.env = {"PATH=/usr/bin:/bin"};
  spec.tail_bytes = tail_bytes;
  return spec;
}

void drain_until_closed(ChildProcess& child) {
  for (int i = 0; i < 500; ++i) {
    pollfd fd{child.output_fd(), POLLIN, 0};
    ::poll(&fd, 1, 10);
    if (!child.read_output()) return;
  }
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
  ChildProcess child(shell("i=0; while [ $i -lt 300 ]; do printf 'line %03d\\n' $i; i=$((i+1)); done; printf 'LAST'", 64));
  drain_until_closed(child);
  const std::string tail = child.tail();
  CHECK(tail.size() <= 64);
  CHECK(tail.size() > 0);
  CHECK(tail.substr(tail.size() - 4) == "LAST");
  child.end();
}

TEST_CASE("end() kills the child's whole process group and exited() does not reap") {
  ChildProcess child(shell("sleep 30 & echo $! ; wait"));
  CHECK(getpgid(child.pid()) == child.pid());  // a group of its own
  CHECK_FALSE(child.exited());
  std::string out;
  for (int i = 0; i < 200 && out.find('\n') == std::string::npos; ++i) {
    pollfd fd{child.output_fd(), POLLIN, 0};
    ::poll(&fd, 1, 10);
    child.read_output();
    out = child.tail();
  }
  const pid_t grandchild = std::stoi(out);
  CHECK(child.end() == "was killed by signal 9 (SIGKILL: Killed)");
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {  // killed with the group (a zombie until its reaper comes)
    std::ifstream stat("/proc/" + std::to_string(grandchild) + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    gone = text.empty() || text.substr(text.rfind(')') + 2, 1) == "Z";
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK(gone);
}

TEST_CASE("pick_environment passes only the named variables that are set") {
  ::setenv("MACHINA_UNIT_A", "1", 1);
  ::unsetenv("MACHINA_UNIT_B");
  CHECK(pick_environment({"MACHINA_UNIT_A", "MACHINA_UNIT_B"}) == std::vector<std::string>{"MACHINA_UNIT_A=1"});
}
