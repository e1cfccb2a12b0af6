// See os_limits.hpp.
#include <machina/errors.hpp>
#include <machina/os_limits.hpp>

#include <seccomp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>

#include <cerrno>
#include <cstring>

namespace machina {
namespace {

void set_limit(int resource, std::uint64_t value, const char* what) {
  const rlimit lim{static_cast<rlim_t>(value), static_cast<rlim_t>(value)};
  if (setrlimit(resource, &lim) != 0) {
    throw ConfigError(std::string("cannot limit ") + what + " to " + std::to_string(value) + ": " +
                      std::strerror(errno));
  }
}

void deny_network() {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (ctx == nullptr) throw ConfigError("no_network: cannot create the seccomp filter");
  // A system call through another ABI (32-bit int 0x80, where socketcall lives) ends the
  // whole worker rather than slipping past the rules, which name native calls only.
  seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
  // socketpair(2) stays allowed: it makes only connected local pairs, never a route out.
  int rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EACCES), SCMP_SYS(socket), 0);
#ifdef __NR_io_uring_setup
  // io_uring can open sockets on its own (IORING_OP_SOCKET).
  if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(io_uring_setup), 0);
#endif
  if (rc == 0) rc = seccomp_load(ctx);  // also sets no_new_privs
  seccomp_release(ctx);
  if (rc != 0) throw ConfigError(std::string("no_network: cannot install the seccomp filter: ") + std::strerror(-rc));
}

}  // namespace

void apply_process_limits(const WorkerLimits& limits) {
  if (limits.address_space_mb) set_limit(RLIMIT_AS, limits.address_space_mb << 20, "the address space");
  if (limits.file_size_mb) {
    // A write past the limit fails with EFBIG instead of killing the worker.
    signal(SIGXFSZ, SIG_IGN);
    set_limit(RLIMIT_FSIZE, limits.file_size_mb << 20, "the file size");
  }
  if (limits.no_network) deny_network();
}

void apply_open_files_limit(std::uint64_t open_files) {
  if (open_files) set_limit(RLIMIT_NOFILE, open_files, "open files");
}

CpuBudget::CpuBudget(std::uint64_t cpu_seconds) : seconds_(cpu_seconds) {
  if (seconds_ == 0) return;
  sigevent ev{};
  ev.sigev_notify = SIGEV_SIGNAL;
  ev.sigev_signo = SIGXCPU;
  if (timer_create(CLOCK_PROCESS_CPUTIME_ID, &ev, &timer_) != 0) {
    throw ConfigError(std::string("cannot limit the CPU time per call: ") + std::strerror(errno));
  }
}

CpuBudget::~CpuBudget() {
  if (seconds_ != 0) timer_delete(timer_);
}

void CpuBudget::start() {
  if (seconds_ == 0) return;
  // The soft RLIMIT_CPU too, at the same distance from the time used so far: programs the
  // tool starts inherit it (the timer is this process's alone).
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  rlimit lim{};
  getrlimit(RLIMIT_CPU, &lim);
  lim.rlim_cur = static_cast<rlim_t>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec + 1 + seconds_);
  if (lim.rlim_max != RLIM_INFINITY && lim.rlim_cur > lim.rlim_max) lim.rlim_cur = lim.rlim_max;
  setrlimit(RLIMIT_CPU, &lim);
  itimerspec budget{};
  budget.it_value.tv_sec = static_cast<time_t>(seconds_);
  timer_settime(timer_, 0, &budget, nullptr);  // relative: from this process's CPU time now
}

void CpuBudget::stop() {
  if (seconds_ == 0) return;
  const itimerspec off{};
  timer_settime(timer_, 0, &off, nullptr);
}

}  // namespace machina
