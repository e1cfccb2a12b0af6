// See sandbox.hpp. Raw system calls (unshare, mount, capset, prctl); no library.
#include <machina/errors.hpp>
#include <machina/isolation/sandbox.hpp>

#include <algorithm>

#include <fcntl.h>
#include <linux/capability.h>
#include <linux/securebits.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace machina::sandbox {
namespace {

[[noreturn]] void fail(const std::string& step) {
  throw ConfigError("process isolation: " + step + ": " + std::strerror(errno));
}

void write_file(const char* path, const std::string& text) {
  const int fd = ::open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) fail(std::string("cannot open ") + path);
  const ssize_t n = ::write(fd, text.data(), text.size());
  const int saved = errno;
  ::close(fd);
  errno = saved;
  if (n != static_cast<ssize_t>(text.size())) fail(std::string("cannot write ") + path);
}

/// Maps this process's user and group in a new user namespace to themselves (the only
/// mapping an unprivileged process may write for itself): tools see the host's uid.
void map_self(uid_t uid, gid_t gid) {
  write_file("/proc/self/setgroups", "deny");
  write_file("/proc/self/uid_map", std::to_string(uid) + " " + std::to_string(uid) + " 1");
  write_file("/proc/self/gid_map", std::to_string(gid) + " " + std::to_string(gid) + " 1");
}

void set_capabilities(std::uint32_t low_bits) {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  data[0].effective = data[0].permitted = low_bits;
  if (::syscall(SYS_capset, &header, data) != 0) fail("cannot drop capabilities");
}

/// Sets (or clears) mount attributes on the mount at `path` (and, `recursive`, on those
/// beneath). EPERM on clearing: a mount the host itself has locked, which stays as it is.
void set_mount_attr(const std::string& path, std::uint64_t set, std::uint64_t clear, bool recursive, const char* step) {
  mount_attr attr{};
  attr.attr_set = set;
  attr.attr_clr = clear;
  if (::syscall(SYS_mount_setattr, AT_FDCWD, path.c_str(), recursive ? AT_RECURSIVE : 0, &attr, sizeof attr) == 0)
    return;
  if (set == 0 && errno == EPERM) return;
  fail(std::string(step) + " " + path);
}

/// Binds each existing path onto itself (with whatever is mounted beneath it); those bound.
std::vector<std::string> bind_in_place(const std::vector<std::string>& paths, unsigned long flags) {
  std::vector<std::string> bound;
  for (const auto& path : paths) {
    struct stat st{};
    if (::stat(path.c_str(), &st) != 0) continue;  // nothing there
    if (::mount(path.c_str(), path.c_str(), nullptr, MS_BIND | flags, nullptr) != 0) fail("cannot bind " + path);
    bound.push_back(path);
  }
  return bound;
}

/// Binds each writable path onto itself, makes every mount read-only, then each of those
/// binds writable again. What is mounted beneath a writable path (a hidden file's cover)
/// stays read-only.
void make_read_only(const std::vector<std::string>& writable) {
  const auto bound = bind_in_place(writable, MS_REC);
  set_mount_attr("/", MOUNT_ATTR_RDONLY, 0, true, "cannot make read-only the mounts beneath");
  for (const auto& path : bound) set_mount_attr(path, 0, MOUNT_ATTR_RDONLY, false, "cannot leave writable");
}

/// Binds each no_exec path onto itself without exec, then each executable file onto itself
/// with exec.
void make_no_exec(const std::vector<std::string>& no_exec, const std::vector<std::string>& executable) {
  for (const auto& path : bind_in_place(no_exec, MS_REC)) {
    set_mount_attr(path, MOUNT_ATTR_NOEXEC, 0, true, "cannot take exec from");
  }
  std::vector<std::string> files;
  for (const auto& path : executable) {
    struct stat st{};
    if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) files.push_back(path);
  }
  for (const auto& path : bind_in_place(files, 0)) {
    set_mount_attr(path, 0, MOUNT_ATTR_NOEXEC, false, "cannot leave executable");
  }
}

}  // namespace

void enter(const Walls& walls) {
  const uid_t uid = geteuid();
  const gid_t gid = getegid();
  if (::unshare(CLONE_NEWUSER) != 0) {
    fail("cannot create a user namespace (unprivileged user namespaces may be disabled on this machine)");
  }
  map_self(uid, gid);
  const int more = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | (walls.own_network ? CLONE_NEWNET : 0);
  if (::unshare(more) != 0) fail("cannot create the mount, PID and IPC namespaces");
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) fail("cannot make mounts private");
  // Each file once, however many names it is given by (a denied name that is also the
  // lease key): looked at before anything is covered, since a covered file looks like /dev/null.
  std::vector<std::pair<std::string, struct stat>> to_hide;
  for (const auto& path : walls.hidden_files) {
    struct stat st{};
    if (::stat(path.c_str(), &st) != 0) continue;  // nothing there to hide
    const bool seen = std::any_of(to_hide.begin(), to_hide.end(), [&](const auto& h) {
      return h.second.st_dev == st.st_dev && h.second.st_ino == st.st_ino;
    });
    if (!seen) to_hide.emplace_back(path, st);
  }
  for (const auto& [path, st] : to_hide) {
    if (S_ISDIR(st.st_mode)) {
      // A directory: covered by an empty, read-only one.
      if (::mount("tmpfs", path.c_str(), "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=0555") !=
          0)
        fail("cannot hide " + path);
      continue;
    }
    if (!S_ISREG(st.st_mode)) {
      errno = EINVAL;
      fail("cannot hide " + path + " (not a regular file or directory)");
    }
    if (::mount("/dev/null", path.c_str(), nullptr, MS_BIND, nullptr) != 0) fail("cannot hide " + path);
  }
  if (walls.read_only || !walls.no_exec.empty()) {
    // The working directory is looked up again: a folder bound onto itself is reached
    // through its new mount only by a path, not by a directory already entered.
    char cwd[4096];
    const bool have_cwd = ::getcwd(cwd, sizeof cwd) != nullptr;
    if (walls.read_only) make_read_only(walls.writable);
    if (!walls.no_exec.empty()) make_no_exec(walls.no_exec, walls.executable);
    if (have_cwd && ::chdir(cwd) != 0) fail(std::string("cannot enter ") + cwd);
  }
}

void seal() {
  // Only the sandbox's own processes: the host's /proc/<pid> (its fds, its memory, its
  // environment) is not there to open.
  if (::mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) {
    fail("cannot mount a /proc for the sandbox");
  }
  // Mounts copied into a namespace owned by a newer user namespace are locked: not even
  // root of that namespace can unmount /proc or uncover a hidden file.
  const uid_t uid = geteuid();
  const gid_t gid = getegid();
  if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) fail("cannot create the inner user namespace");
  map_self(uid, gid);
}

void restrict_template() {
  // No exec, setuid or file capability gives anything back: root keeps no capability on
  // exec, and the bits cannot be unset.
  const unsigned long bits = SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP |
                             SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_KEEP_CAPS_LOCKED | SECBIT_NO_CAP_AMBIENT_RAISE |
                             SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;
  if (::prctl(PR_SET_SECUREBITS, bits, 0, 0, 0) != 0) fail("cannot lock the securebits");
  for (unsigned long cap = 0; cap <= CAP_LAST_CAP; ++cap) {
    if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL) fail("cannot empty the bounding set");
  }
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) fail("cannot set no_new_privs");
  static_assert(CAP_SYS_ADMIN < 32);
  set_capabilities(1u << CAP_SYS_ADMIN);
}

void drop_last_capability() {
  set_capabilities(0);
}

int thread_count() {
  std::FILE* f = std::fopen("/proc/self/status", "re");
  if (f == nullptr) return -1;
  char line[256];
  int threads = -1;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "Threads: %d", &threads) == 1) break;
  }
  std::fclose(f);
  return threads;
}

}  // namespace machina::sandbox
