// sandbox (the walls of --isolation process), in a child process of the test: after enter()
// and in the init it forks, this is PID 1 and the host's processes are not there, a hidden
// file reads empty, with own_network nothing is reachable, read_only leaves only the
// writable paths writable; restrict_template() sets no_new_privs and keeps one capability,
// drop_last_capability() none. Skipped with a message where the kernel refuses namespaces.
#include <machina/errors.hpp>
#include <machina/isolation/sandbox.hpp>

#include <doctest/doctest.h>

#include "temp_dir.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

using namespace machina;

namespace {

constexpr int kRefused = 77;  // the kernel refused the walls: nothing to test here

int wait_status(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/// Runs `inside` in the init of new walls (a grandchild of the test): its exit status,
/// kRefused if the walls could not be built.
template <class Inside>
int in_walls(const sandbox::Walls& walls, Inside inside) {
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    try {
      sandbox::enter(walls);
    } catch (const ConfigError&) {
      _exit(kRefused);
    }
    const pid_t init = fork();
    if (init < 0) _exit(90);
    if (init == 0) {
      int rc = 91;
      try {
        sandbox::seal();
        rc = inside();
      } catch (const ConfigError&) {
        rc = 92;
      }
      _exit(rc);
    }
    _exit(wait_status(init));
  }
  return wait_status(child);
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_CASE("thread_count counts this process's threads") {
  const int before = sandbox::thread_count();
  REQUIRE(before >= 1);
  int during = 0;
  std::thread t([&] { during = sandbox::thread_count(); });
  t.join();
  CHECK(during == before + 1);
}

TEST_CASE("inside the walls: PID 1, a /proc of its own, hidden files empty, no network") {
  TempDir tmp;
  const std::string secret = (tmp.path / "lease.key").string();
  std::ofstream(secret) << "the key";
  sandbox::Walls walls;
  walls.own_network = true;
  walls.hidden_files = {secret, (tmp.path / "missing").string()};
  const int rc = in_walls(walls, [&] {
    if (getpid() != 1) return 1;
    int processes = 0;
    if (DIR* d = opendir("/proc")) {
      while (const dirent* e = readdir(d)) processes += (e->d_name[0] >= '1' && e->d_name[0] <= '9');
      closedir(d);
    }
    if (processes != 1) return 2;
    if (!read_all(secret).empty()) return 3;
    const int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) return 4;
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(80);
    inet_pton(AF_INET, "1.1.1.1", &to.sin_addr);
    if (connect(s, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0) return 5;
    if (errno != ENETUNREACH) return 6;
    return 0;
  });
  if (rc == kRefused) {
    MESSAGE("this kernel refuses unprivileged namespaces: skipped");
    return;
  }
  CHECK(rc == 0);
  CHECK(read_all(secret) == "the key");  // outside, the file keeps its content
}

TEST_CASE("read_only walls: writes only beneath the writable paths") {
  TempDir tmp;
  std::filesystem::create_directories(tmp.path / "w");
  const std::string inside_w = (tmp.path / "w" / "f").string();
  const std::string outside_w = (tmp.path / "g").string();
  sandbox::Walls walls;
  walls.read_only = true;
  walls.writable = {(tmp.path / "w").string()};
  const int rc = in_walls(walls, [&] {
    const int ok = open(inside_w.c_str(), O_WRONLY | O_CREAT, 0600);
    if (ok < 0) return 1;
    close(ok);
    if (open(outside_w.c_str(), O_WRONLY | O_CREAT, 0600) >= 0) return 2;
    if (errno != EROFS) return 3;
    return 0;
  });
  if (rc == kRefused) {
    MESSAGE("this kernel refuses unprivileged namespaces: skipped");
    return;
  }
  CHECK(rc == 0);
  CHECK(std::filesystem::exists(inside_w));
  CHECK_FALSE(std::filesystem::exists(outside_w));
}

TEST_CASE("a template keeps CAP_SYS_ADMIN alone and cannot gain more, a call process none") {
  const int rc = in_walls(sandbox::Walls{}, [] {
    sandbox::restrict_template();
    if (prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1) return 1;
    if (prctl(PR_CAPBSET_READ, CAP_SYS_ADMIN, 0, 0, 0) != 0) return 2;  // the bounding set is empty
    const std::string status = read_all("/proc/self/status");
    if (status.find("CapEff:\t0000000000200000") == std::string::npos) return 3;
    sandbox::drop_last_capability();
    if (read_all("/proc/self/status").find("CapEff:\t0000000000000000") == std::string::npos) return 4;
    return 0;
  });
  if (rc == kRefused) {
    MESSAGE("this kernel refuses unprivileged namespaces: skipped");
    return;
  }
  CHECK(rc == 0);
}
