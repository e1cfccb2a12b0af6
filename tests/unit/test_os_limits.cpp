// os_limits (what a worker puts on itself): each limit is set in a child process and
// checked there (a file past the size limit fails with EFBIG, an allocation past the
// address space fails, a socket is refused with EACCES while socketpair works), the CPU
// budget ends a spinning process with SIGXCPU and does nothing when stopped in time.
#include <machina/errors.hpp>
#include <machina/os_limits.hpp>

#include <doctest/doctest.h>

#include "temp_dir.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <string>

using namespace machina;

namespace {

/// Runs `body` in a child process; its exit status (or 128 + the signal that ended it).
template <class Body>
int in_child(Body body) {
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int rc = 99;
    try {
      rc = body();
    } catch (...) {
      rc = 98;
    }
    _exit(rc);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

}  // namespace

TEST_CASE("any() is true for each limit alone") {
  CHECK_FALSE(WorkerLimits{}.any());
  WorkerLimits l;
  l.cpu_seconds = 1;
  CHECK(l.any());
  l = {};
  l.address_space_mb = 1;
  CHECK(l.any());
  l = {};
  l.open_files = 1;
  CHECK(l.any());
  l = {};
  l.file_size_mb = 1;
  CHECK(l.any());
  l = {};
  l.no_network = true;
  CHECK(l.any());
}

TEST_CASE("the file size limit makes a longer write fail with EFBIG, not a signal") {
  TempDir tmp;
  const std::string path = (tmp.path / "big").string();
  CHECK(in_child([&] {
          WorkerLimits l;
          l.file_size_mb = 1;
          apply_process_limits(l);
          const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
          if (fd < 0) return 1;
          const std::string chunk(1 << 20, 'x');
          if (write(fd, chunk.data(), chunk.size()) != static_cast<ssize_t>(chunk.size())) return 2;
          if (write(fd, "y", 1) != -1 || errno != EFBIG) return 3;
          return 0;
        }) == 0);
}

TEST_CASE("the address space limit makes a larger mapping fail") {
  CHECK(in_child([] {
          WorkerLimits l;
          l.address_space_mb = 4096;
          apply_process_limits(l);
          rlimit lim{};
          getrlimit(RLIMIT_AS, &lim);
          if (lim.rlim_cur != 4096ull << 20) return 1;
          void* p = mmap(nullptr, 8192ull << 20, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
          return p == MAP_FAILED ? 0 : 2;
        }) == 0);
}

TEST_CASE("the open files limit is set, and a limit above the hard one is refused by name") {
  CHECK(in_child([] {
          apply_open_files_limit(32);
          rlimit lim{};
          getrlimit(RLIMIT_NOFILE, &lim);
          return lim.rlim_cur == 32 && lim.rlim_max == 32 ? 0 : 1;
        }) == 0);
  CHECK(in_child([] {
          apply_open_files_limit(16);
          try {
            apply_open_files_limit(1 << 20);  // above the hard limit just lowered
          } catch (const ConfigError& e) {
            return std::string(e.what()).find("cannot limit open files to 1048576") == 0 ? 0 : 2;
          }
          return 1;
        }) == 0);
  CHECK(in_child([] {
          apply_open_files_limit(0);  // none: the limit is left alone
          return 0;
        }) == 0);
}

TEST_CASE("no_network refuses socket(2) with EACCES and keeps socketpair") {
  CHECK(in_child([] {
          WorkerLimits l;
          l.no_network = true;
          apply_process_limits(l);
          if (socket(AF_INET, SOCK_STREAM, 0) != -1 || errno != EACCES) return 1;
          if (socket(AF_UNIX, SOCK_STREAM, 0) != -1 || errno != EACCES) return 2;
          int pair[2];
          if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0) return 3;
          return 0;
        }) == 0);
}

TEST_CASE("a CPU budget ends a spinning call with SIGXCPU, stopped in time it does nothing") {
  CHECK(in_child([] {
          CpuBudget budget(1);
          budget.start();
          volatile unsigned long spins = 0;
          for (;;) spins = spins + 1;
          return 0;
        }) == 128 + SIGXCPU);
  CHECK(in_child([] {
          CpuBudget budget(1);
          budget.start();
          budget.stop();
          rlimit lim{};
          getrlimit(RLIMIT_CPU, &lim);
          if (lim.rlim_cur == RLIM_INFINITY) return 1;  // programs the tool starts inherit a limit
          return 0;
        }) == 0);
  CHECK(in_child([] {
          CpuBudget none(0);  // no timer, start and stop do nothing
          none.start();
          none.stop();
          rlimit lim{};
          getrlimit(RLIMIT_CPU, &lim);
          return lim.rlim_cur == RLIM_INFINITY ? 0 : 1;
        }) == 0);
}
