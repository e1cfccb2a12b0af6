// See sandbox_exec.hpp. Raw system calls for Landlock (no library wraps them here);
// libseccomp for the seccomp filter.
#include <machina/clock.hpp>
#include <machina/errors.hpp>
#include <machina/isolation/sandbox.hpp>
#include <machina/isolation/sandbox_exec.hpp>

#include <nlohmann/json.hpp>

#include <elf.h>
#include <fcntl.h>
#include <ftw.h>
#include <linux/landlock.h>
#include <poll.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <utility>

namespace machina::sandbox {
namespace {

constexpr int kCannotConfine = 126;
constexpr int kMemoryCheckMs = 50;  // how often the init looks at the program's memory and folders

// Landlock rights by ABI version (linux/landlock.h of older headers lacks the newer ones).
constexpr std::uint64_t kExecute = 1ULL << 0;
constexpr std::uint64_t kWriteFile = 1ULL << 1;
constexpr std::uint64_t kReadFile = 1ULL << 2;
constexpr std::uint64_t kReadDir = 1ULL << 3;
constexpr std::uint64_t kWriteTreeV1 = (1ULL << 4) | (1ULL << 5) | (1ULL << 6) | (1ULL << 7) | (1ULL << 8) |
                                       (1ULL << 9) | (1ULL << 10) | (1ULL << 11) | (1ULL << 12);  // remove, make
constexpr std::uint64_t kRefer = 1ULL << 13;                                                      // ABI 2
constexpr std::uint64_t kTruncate = 1ULL << 14;                                                   // ABI 3
constexpr std::uint64_t kFileRights = kExecute | kWriteFile | kReadFile | kTruncate;

void say(const std::string& what) {
  const std::string line = "machina-toolhost sandbox: " + what + "\n";
  (void)!::write(STDERR_FILENO, line.data(), line.size());
}

[[noreturn]] void fail(const std::string& step) {
  throw ConfigError(step + ": " + std::strerror(errno));
}

int landlock_abi_now() {
  const long abi = ::syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
  return abi > 0 ? static_cast<int>(abi) : 0;
}

std::uint64_t write_rights(int abi) {
  std::uint64_t r = kWriteFile | kWriteTreeV1;
  if (abi >= 2) r |= kRefer;
  if (abi >= 3) r |= kTruncate;
  return r;
}

/// Landlock: what the program may read, write and execute from now on (inherited across
/// execve and by every process it could start).
void apply_landlock(const ExecSpec& spec) {
  const int abi = landlock_abi_now();
  if (abi < 1) {
    errno = ENOSYS;
    fail("Landlock is not available");
  }
  std::uint64_t handled = 0;
  if (spec.restrict_read) handled |= kReadFile | kReadDir;
  if (spec.restrict_write) handled |= write_rights(abi);
  if (spec.restrict_exec) handled |= kExecute;
  landlock_ruleset_attr attr{};
  attr.handled_access_fs = handled;
  const int ruleset = static_cast<int>(::syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0));
  if (ruleset < 0) fail("cannot create the Landlock ruleset");
  auto allow = [&](const std::string& path, std::uint64_t rights) {
    rights &= handled;
    if (rights == 0) return;
    const int fd = ::open(path.c_str(), O_PATH | O_CLOEXEC);
    if (fd < 0) return;  // nothing there: nothing to allow
    struct stat st{};
    if (::fstat(fd, &st) == 0 && !S_ISDIR(st.st_mode)) rights &= kFileRights;
    landlock_path_beneath_attr rule{};
    rule.allowed_access = rights;
    rule.parent_fd = fd;
    const long rc = ::syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &rule, 0);
    const int saved = errno;
    ::close(fd);
    errno = saved;
    if (rc != 0) fail("cannot allow " + path + " in the Landlock ruleset");
  };
  for (const auto& p : spec.read_paths) allow(p, kReadFile | kReadDir);
  for (const auto& p : spec.write_paths) allow(p, kReadFile | kReadDir | write_rights(abi));
  for (const auto& p : spec.exec_paths) allow(p, kExecute | kReadFile);
  // Devices every program expects.
  allow("/dev/null", kReadFile | kWriteFile);
  for (const char* p : {"/dev/zero", "/dev/urandom", "/dev/random"}) allow(p, kReadFile);
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) fail("cannot set no_new_privs");
  if (::syscall(SYS_landlock_restrict_self, ruleset, 0) != 0) fail("cannot enforce the Landlock ruleset");
  ::close(ruleset);
}

/// seccomp: no new process (threads still), no socket; with writing restricted, no file
/// given a set-user-ID or set-group-ID bit. A system call through another ABI (32-bit
/// int 0x80) ends the process rather than slipping past rules that name native calls.
void apply_seccomp(const ExecSpec& spec) {
  if (!spec.no_sockets && !spec.no_processes && !spec.restrict_write) return;
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (ctx == nullptr) {
    errno = ENOMEM;
    fail("cannot create the seccomp filter");
  }
  seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
  int rc = 0;
  auto rule = [&](std::uint32_t action, int call, unsigned count, const scmp_arg_cmp* args) {
    if (rc == 0) rc = seccomp_rule_add_array(ctx, action, call, count, args);
  };
  if (spec.no_processes) {
    rule(SCMP_ACT_ERRNO(EPERM), SCMP_SYS(fork), 0, nullptr);
    rule(SCMP_ACT_ERRNO(EPERM), SCMP_SYS(vfork), 0, nullptr);
    const scmp_arg_cmp not_a_thread = SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0);
    rule(SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1, &not_a_thread);
    // clone3 passes its flags in memory, out of a filter's sight: refused as unknown, so
    // that the C library falls back to clone for its threads.
    rule(SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0, nullptr);
  }
  if (spec.no_sockets) {
    rule(SCMP_ACT_ERRNO(EACCES), SCMP_SYS(socket), 0, nullptr);
  }
  if (spec.restrict_write) {
    // Files the program writes belong to the host's user (root, for a host run as root): a
    // set-ID bit on one would hand that user's rights to whoever runs it. Refused wherever
    // a mode is given: chmod and file creation (the mode's argument position per call).
    const std::pair<int, unsigned> mode_at[] = {
        {SCMP_SYS(chmod), 1},
        {SCMP_SYS(fchmod), 1},
        {SCMP_SYS(fchmodat), 2},
        {SCMP_SYS(open), 2},
        {SCMP_SYS(openat), 3},
        {SCMP_SYS(creat), 1},
        {SCMP_SYS(mknod), 1},
        {SCMP_SYS(mknodat), 2},
#if defined(__x86_64__) || defined(__aarch64__)
        {452, 2},  // fchmodat2 (newer than some libseccomp's tables)
#endif
    };
    for (const auto& [call, arg] : mode_at) {
      for (const scmp_datum_t bit : {scmp_datum_t{S_ISUID}, scmp_datum_t{S_ISGID}}) {
        const scmp_arg_cmp has_bit{arg, SCMP_CMP_MASKED_EQ, bit, bit};
        rule(SCMP_ACT_ERRNO(EPERM), call, 1, &has_bit);
      }
    }
    // openat2 passes its mode in memory, out of a filter's sight: refused as unknown (callers
    // fall back to openat).
    rule(SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(openat2), 0, nullptr);
  }
#ifdef __NR_io_uring_setup
  // io_uring can open sockets and start work on its own.
  rule(SCMP_ACT_ERRNO(EPERM), SCMP_SYS(io_uring_setup), 0, nullptr);
#endif
  if (rc == 0) rc = seccomp_load(ctx);  // also sets no_new_privs
  seccomp_release(ctx);
  if (rc != 0) {
    errno = -rc;
    fail("cannot install the seccomp filter");
  }
}

/// Sets a resource limit (soft and hard); 0: leaves it as it is.
void set_limit(int resource, std::uint64_t value, const char* what) {
  if (value == 0) return;
  const rlimit l{static_cast<rlim_t>(value), static_cast<rlim_t>(value)};
  if (::setrlimit(resource, &l) != 0) fail(std::string("cannot limit the ") + what);
}

/// In the program's own process, just before it is executed.
[[noreturn]] void run_program(const ExecSpec& spec, char** argv) {
  try {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    restrict_template();     // securebits locked, bounding set empty, no_new_privs ...
    drop_last_capability();  // ... and no capability left, even in the sandbox's namespaces
    if (spec.restrict_read || spec.restrict_write || spec.restrict_exec) apply_landlock(spec);
    apply_seccomp(spec);
    set_limit(RLIMIT_AS, spec.address_space_mb << 20, "address space");
    set_limit(RLIMIT_NOFILE, spec.open_files, "open files");
    // No file may hold more than all the writable paths may.
    std::uint64_t file_mb = spec.file_size_mb;
    if (spec.write_quota_mb > 0 && (file_mb == 0 || file_mb > spec.write_quota_mb)) file_mb = spec.write_quota_mb;
    set_limit(RLIMIT_FSIZE, file_mb << 20, "file size");
    set_limit(RLIMIT_CPU, spec.cpu_seconds, "CPU time");
  } catch (const ConfigError& e) {
    say(e.what());
    ::_exit(kCannotConfine);
  }
  ::execv(argv[0], argv);
  say(std::string("cannot execute ") + argv[0] + ": " + std::strerror(errno));
  ::_exit(kCannotConfine);
}

/// Bytes allocated to the files beneath `path` (links not followed, other filesystems not
/// entered).
std::uint64_t allocated_bytes(const std::string& path) {
  static thread_local std::uint64_t total = 0;
  total = 0;
  ::nftw(
      path.c_str(),
      [](const char*, const struct stat* st, int type, FTW*) {
        if (type == FTW_F || type == FTW_D || type == FTW_SL) total += static_cast<std::uint64_t>(st->st_blocks) * 512;
        return 0;
      },
      16, FTW_PHYS | FTW_MOUNT);
  return total;
}

/// Kills the program and ends the init with `status`, saying why.
[[noreturn]] void stop(pid_t pid, const std::string& why, int exit_status) {
  say(why);
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::_exit(exit_status);
}

/// Waits for `pid`, reaping whatever else ends meanwhile, watching its memory and what its
/// writable paths hold; its wait status.
int wait_for(pid_t pid, const ExecSpec& spec) {
  const bool watch = spec.memory_mb > 0 || spec.write_quota_mb > 0;
  // A large folder takes a while to measure: the init spends at most a twentieth of its
  // time measuring.
  std::int64_t next_measure_ms = 0;
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(-1, &status, watch ? WNOHANG : 0);
    if (r == pid) return status;
    if (r > 0) continue;  // an orphan of the program's
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return 0;
    // Nothing ended: look at the program's memory and its folders, then sleep a little.
    if (spec.memory_mb > 0) {
      if (const auto mb = resident_mb(pid); mb > spec.memory_mb) {
        stop(pid,
             "the program grew past its memory cap of " + std::to_string(spec.memory_mb) + " MiB (resident " +
                 std::to_string(mb) + " MiB) and was killed",
             kMemoryCapStatus);
      }
    }
    if (spec.write_quota_mb > 0 && steady_now_ms() >= next_measure_ms) {
      const std::int64_t started = steady_now_ms();
      std::uint64_t held = 0;
      for (const auto& path : spec.write_paths) held += allocated_bytes(path);
      next_measure_ms = steady_now_ms() + 19 * (steady_now_ms() - started);
      if (held > (spec.write_quota_mb << 20)) {
        stop(pid,
             "the program's writable folders grew past their quota of " + std::to_string(spec.write_quota_mb) +
                 " MiB (they hold " + std::to_string(held >> 20) + " MiB) and it was killed",
             kWriteQuotaStatus);
      }
    }
    ::poll(nullptr, 0, kMemoryCheckMs);
  }
}

/// Ends this process the way `status` says the child ended.
[[noreturn]] void end_like(int status) {
  if (WIFSIGNALED(status)) {
    signal(WTERMSIG(status), SIG_DFL);
    ::kill(::getpid(), WTERMSIG(status));
    ::_exit(128 + WTERMSIG(status));
  }
  ::_exit(WIFEXITED(status) ? WEXITSTATUS(status) : kCannotConfine);
}

/// PID 1 of the sandbox: /proc of its own, then the program; ends when it ends.
[[noreturn]] void run_init(const ExecSpec& spec, char** argv) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  try {
    seal();
  } catch (const ConfigError& e) {
    say(e.what());
    ::_exit(kCannotConfine);
  }
  const pid_t program = ::fork();
  if (program < 0) {
    say(std::string("cannot start the program: ") + std::strerror(errno));
    ::_exit(kCannotConfine);
  }
  if (program == 0) run_program(spec, argv);
  // Signals that would end an init by default are ignored by the kernel; nothing to do.
  end_like(wait_for(program, spec));
}

}  // namespace

std::uint64_t resident_mb(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/statm", static_cast<int>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char text[128] = {};
  const ssize_t n = ::read(fd, text, sizeof text - 1);
  ::close(fd);
  unsigned long long size = 0, resident = 0;
  if (n <= 0 || std::sscanf(text, "%llu %llu", &size, &resident) != 2) return 0;
  return resident * static_cast<unsigned long long>(sysconf(_SC_PAGESIZE)) / (1024 * 1024);
}

std::string ExecSpec::to_json() const {
  return nlohmann::json{{"own_network", own_network},       {"no_sockets", no_sockets},
                        {"no_processes", no_processes},     {"restrict_read", restrict_read},
                        {"restrict_write", restrict_write}, {"restrict_exec", restrict_exec},
                        {"read_paths", read_paths},         {"write_paths", write_paths},
                        {"exec_paths", exec_paths},         {"no_exec_paths", no_exec_paths},
                        {"hidden_files", hidden_files},     {"write_quota_mb", write_quota_mb},
                        {"memory_mb", memory_mb},           {"address_space_mb", address_space_mb},
                        {"open_files", open_files},         {"file_size_mb", file_size_mb},
                        {"cpu_seconds", cpu_seconds}}
      .dump();
}

ExecSpec ExecSpec::from_json(std::string_view text) {
  try {
    const auto j = nlohmann::json::parse(text);
    ExecSpec s;
    s.own_network = j.at("own_network").get<bool>();
    s.no_sockets = j.at("no_sockets").get<bool>();
    s.no_processes = j.at("no_processes").get<bool>();
    s.restrict_read = j.at("restrict_read").get<bool>();
    s.restrict_write = j.at("restrict_write").get<bool>();
    s.restrict_exec = j.at("restrict_exec").get<bool>();
    s.read_paths = j.at("read_paths").get<std::vector<std::string>>();
    s.write_paths = j.at("write_paths").get<std::vector<std::string>>();
    s.exec_paths = j.at("exec_paths").get<std::vector<std::string>>();
    s.no_exec_paths = j.value("no_exec_paths", std::vector<std::string>{});
    s.hidden_files = j.at("hidden_files").get<std::vector<std::string>>();
    s.write_quota_mb = j.value("write_quota_mb", std::uint64_t{0});
    s.memory_mb = j.at("memory_mb").get<std::uint64_t>();
    s.address_space_mb = j.at("address_space_mb").get<std::uint64_t>();
    s.open_files = j.at("open_files").get<std::uint64_t>();
    s.file_size_mb = j.at("file_size_mb").get<std::uint64_t>();
    s.cpu_seconds = j.value("cpu_seconds", std::uint64_t{0});
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(std::string("not a sandbox spec: ") + e.what());
  }
}

const Support& support() {
  static const Support probed = [] {
    Support s;
    const char* off = std::getenv("MACHINA_TOOLHOST_NO_LANDLOCK");
    s.landlock_abi = off != nullptr && std::strcmp(off, "1") == 0 ? 0 : landlock_abi_now();
    // The walls are made in a child: whether this kernel lets an unprivileged process make
    // a user namespace and, inside it, the others.
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
      s.namespaces_why = std::string("cannot probe: ") + std::strerror(errno);
      return s;
    }
    const pid_t child = ::fork();
    if (child == 0) {
      int err = 0;
      if (::unshare(CLONE_NEWUSER) != 0 || ::unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNET) != 0)
        err = errno;
      (void)!::write(pipe_fds[1], &err, sizeof err);
      ::_exit(0);
    }
    ::close(pipe_fds[1]);
    int err = -1;
    if (child > 0) {
      if (::read(pipe_fds[0], &err, sizeof err) != static_cast<ssize_t>(sizeof err)) err = -1;
      ::waitpid(child, nullptr, 0);
    }
    ::close(pipe_fds[0]);
    s.namespaces = err == 0;
    if (!s.namespaces) {
      s.namespaces_why = err > 0 ? std::string("user namespaces are not available to this user: ") + std::strerror(err)
                                 : std::string("user namespaces could not be probed");
    }
    return s;
  }();
  return probed;
}

int exec_in_sandbox(const ExecSpec& spec, char** argv) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  ::close_range(3, ~0U, 0);  // nothing of the host's beyond the standard streams
  if (argv == nullptr || argv[0] == nullptr) {
    say("no program to run");
    return kCannotConfine;
  }
  try {
    enter(Walls{spec.own_network, spec.hidden_files, spec.restrict_write, spec.write_paths, spec.no_exec_paths,
                spec.exec_paths});
  } catch (const ConfigError& e) {
    say(e.what());
    return kCannotConfine;
  }
  const pid_t init = ::fork();
  if (init < 0) {
    say(std::string("cannot start the sandbox: ") + std::strerror(errno));
    return kCannotConfine;
  }
  if (init == 0) run_init(spec, argv);
  int status = 0;
  while (::waitpid(init, &status, 0) < 0) {
    if (errno != EINTR) return kCannotConfine;
  }
  end_like(status);
}

std::string elf_interpreter(const std::string& program) {
  const int fd = ::open(program.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::string found;
  Elf64_Ehdr eh{};
  if (::pread(fd, &eh, sizeof eh, 0) == static_cast<ssize_t>(sizeof eh) &&
      std::memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 && eh.e_ident[EI_CLASS] == ELFCLASS64) {
    for (unsigned i = 0; i < eh.e_phnum && i < 256; ++i) {
      Elf64_Phdr ph{};
      if (::pread(fd, &ph, sizeof ph, static_cast<off_t>(eh.e_phoff + i * eh.e_phentsize)) !=
          static_cast<ssize_t>(sizeof ph))
        break;
      if (ph.p_type != PT_INTERP || ph.p_filesz == 0 || ph.p_filesz > 4096) continue;
      std::string path(ph.p_filesz, '\0');
      if (::pread(fd, path.data(), path.size(), static_cast<off_t>(ph.p_offset)) == static_cast<ssize_t>(path.size())) {
        path.resize(std::strlen(path.c_str()));
        std::error_code ec;
        const auto real = std::filesystem::canonical(path, ec);
        found = ec ? path : real.string();
      }
      break;
    }
  }
  ::close(fd);
  return found;
}

}  // namespace machina::sandbox
