// See worker.hpp. Three processes, each with one job:
//  - the launcher (started by the host) builds the walls and waits for the template;
//  - the template (PID 1 of the sandbox) loads the tools and keeps call processes ready;
//  - a call process (PID 1 of a namespace of its own, made by clone3 from the template)
//    drops every privilege, waits for its one call, runs it, answers and exits. When it
//    ends, the kernel ends everything it started (even a setsid escapee): that is what a
//    PID namespace's init ending means.
#include <machina/call_context.hpp>
#include <machina/errors.hpp>
#include <machina/fd_io.hpp>
#include <machina/isolation/worker.hpp>
#include <machina/isolation/worker_protocol.hpp>
#include <machina/tool_registry.hpp>

#include <fcntl.h>
#include <linux/sched.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

namespace machina::worker {
namespace {

constexpr auto kIdPidfd = static_cast<idtype_t>(3);  // P_PIDFD (linux/wait.h, which clashes with sys/wait.h)

// Where a call process finds its pipes.
constexpr int kCallFd = 3;
constexpr int kResultFd = 4;

// When the host dies, take every process this worker started with it: the launcher leads
// the process group of the launcher and the template.
void on_host_gone(int) {
  kill(0, SIGKILL);
}

/// Reads exactly `n` bytes; false at end of input or on an error.
bool read_exact(int fd, char* data, std::size_t n) {
  while (n > 0) {
    const ssize_t got = ::read(fd, data, n);
    if (got > 0) {
      data += got;
      n -= static_cast<std::size_t>(got);
    } else if (got < 0 && errno == EINTR) {
      continue;
    } else {
      return false;
    }
  }
  return true;
}

void complain(const std::string& what) {
  const std::string line = "machina-toolhost worker: " + what + "\n";
  (void)write_all(STDERR_FILENO, line);
}

// --- a call process ---------------------------------------------------------------------

volatile sig_atomic_t g_call_process = 0;  // set in a call process, before its call

// The init of a PID namespace is spared every signal it sends itself whose action is the
// default, so a tool's raise(SIGSEGV), abort() or kill(getpid(), SIGTERM) would be lost.
// A handler, installed once in the template and inherited by every call process, stands
// in for the default action: a call process tells the host which signal ended the call (a
// `died` frame on the result pipe) and exits. In a process a tool forked (not an init) it
// gives the signal its default action back and lets it land.
void on_fatal_signal(int sig) {
  if (::getpid() != 1) {
    ::kill(::getpid(), sig);  // SA_RESETHAND restored the default; SA_NODEFER lets it in
    return;
  }
  if (!g_call_process) ::_exit(128 + sig);  // the template itself
  char frame[kDiedFrameBytes];
  encode_died(sig, frame);
  (void)write_all(kResultFd, std::string_view(frame, sizeof frame));
  ::_exit(128 + sig);
}

void stand_in_for_default_signal_actions() {
  struct sigaction sa{};
  sa.sa_handler = on_fatal_signal;
  sa.sa_flags = SA_RESETHAND | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  for (int sig = 1; sig <= SIGRTMAX; ++sig) {
    // Kept as they are: the unstoppable, those whose default is to ignore or to stop (an
    // init ignores those too), and whatever the process already ignores (SIGPIPE: a
    // write to a closed pipe fails with EPIPE, as it always has in a worker).
    switch (sig) {
      case SIGKILL:
      case SIGSTOP:
      case SIGCHLD:
      case SIGCONT:
      case SIGURG:
      case SIGWINCH:
      case SIGTSTP:
      case SIGTTIN:
      case SIGTTOU: continue;
      default: break;
    }
    struct sigaction old{};
    if (sigaction(sig, nullptr, &old) != 0 || old.sa_handler == SIG_IGN) continue;  // (glibc's own: EINVAL)
    sigaction(sig, &sa, nullptr);
  }
}

[[noreturn]] void run_call_process(const WorkerConfig& config, const ToolRegistry& registry, int call_fd,
                                   int result_fd) {
  // Made by a raw clone3 (glibc has no wrapper that makes a PID namespace's init):
  // glibc's cached thread id is the template's, which is 1 as this process's is (both are
  // the init of their namespace), so raise() and the rest of glibc stay right.
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // the template (outside this namespace) is gone: so is this call
  setsid();                          // a tool's kill(0, ...) reaches its own group only
  const int call = fcntl(call_fd, F_DUPFD_CLOEXEC, kResultFd + 1);
  const int result = fcntl(result_fd, F_DUPFD_CLOEXEC, kResultFd + 1);
  if (call < 0 || result < 0 || dup3(call, kCallFd, O_CLOEXEC) < 0 || dup3(result, kResultFd, O_CLOEXEC) < 0) {
    complain(std::string("cannot set up a call process: ") + std::strerror(errno));
    _exit(2);
  }
  ::close_range(kResultFd + 1, ~0U, 0);  // the control socket, other calls' pipes: not this call's
  g_call_process = 1;
  try {
    sandbox::drop_last_capability();
    apply_open_files_limit(config.limits.open_files);
    CpuBudget cpu_budget(config.limits.cpu_seconds);
    char header[kFrameHeader];
    if (!read_exact(kCallFd, header, sizeof header)) _exit(0);  // the host did not need it
    std::uint32_t size = 0;
    FrameType type{};
    read_header(std::string_view(header, sizeof header), size, type);
    Call call_frame;
    std::string payload;
    if (type == FrameType::call && size <= config.max_frame_bytes) {
      payload.resize(size);
      if (!read_exact(kCallFd, payload.data(), size)) _exit(0);
    }
    if (payload.size() != size || !decode_call(payload, call_frame)) {
      complain("malformed call frame from the host");
      _exit(2);
    }
    const Tool* tool = registry.find(call_frame.aid);
    CallContext ctx(config.max_output_bytes, call_frame.state ? call_frame.state : std::make_shared<const Slots>());
    int rc = MACHINA_TOOL_FAULT;
    if (tool == nullptr) {
      ctx.error = "the worker has no tool " + call_frame.aid;
    } else {
      cpu_budget.start();
      rc = tool->invoke(tool->tool_data, &host_api(), ctx.as_call(), call_frame.input_json.c_str(),
                        call_frame.input_json.size());
      cpu_budget.stop();
    }
    std::string out;
    encode_result(rc, ctx, out);
    (void)write_all(kResultFd, out);
  } catch (const ConfigError& e) {
    complain(e.what());
    _exit(2);
  }
  _exit(0);
}

// --- the template -------------------------------------------------------------------------

/// The template's children: call processes made ahead of time, and those still running.
struct CallProcess {
  pid_t pid;
  int pidfd;
};

/// Makes one call process and hands the host its pipes. False if the host is gone.
bool make_call_process(const WorkerConfig& config, const ToolRegistry& registry, std::vector<CallProcess>& children) {
  int cp[2] = {-1, -1}, rp[2] = {-1, -1};
  if (pipe2(cp, O_CLOEXEC) != 0 || pipe2(rp, O_CLOEXEC) != 0)
    throw ConfigError(std::string("cannot create a pipe: ") + std::strerror(errno));
  int pidfd = -1;
  clone_args args{};
  args.flags = CLONE_NEWPID | CLONE_PIDFD;
  args.pidfd = reinterpret_cast<std::uint64_t>(&pidfd);
  args.exit_signal = SIGCHLD;
  const long pid = ::syscall(SYS_clone3, &args, sizeof args);
  if (pid == 0) run_call_process(config, registry, cp[0], rp[1]);
  const int saved = errno;
  ::close(rp[1]);
  if (pid < 0) {
    for (int fd : {cp[0], cp[1], rp[0]}) ::close(fd);
    throw ConfigError(std::string("cannot start a call process: ") + std::strerror(saved));
  }
  children.push_back({static_cast<pid_t>(pid), pidfd});

  std::string frame;
  encode_ready(Ready{static_cast<std::int32_t>(pid)}, frame);
  const int fds[kReadyFds] = {cp[1], cp[0], rp[0], pidfd};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof fds)] = {};
  iovec iov{frame.data(), frame.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof fds);
  std::memcpy(CMSG_DATA(c), fds, sizeof fds);
  ssize_t sent;
  do {
    sent = ::sendmsg(config.control_fd, &msg, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  // The frame is 9 bytes: a stream socket takes it whole or not at all.
  for (int fd : {cp[0], cp[1], rp[0]}) ::close(fd);
  return sent == static_cast<ssize_t>(frame.size());
}

/// Reaps a call process that ended and tells the host how. False if the host is gone.
bool reap(const WorkerConfig& config, CallProcess& child) {
  siginfo_t info{};
  while (::waitid(kIdPidfd, static_cast<id_t>(child.pidfd), &info, WEXITED) != 0) {
    if (errno != EINTR) return true;  // (not ours to reap after all: nothing to say)
  }
  ::close(child.pidfd);
  std::string frame;
  encode_ended(Ended{static_cast<std::int32_t>(child.pid), info.si_code, info.si_status}, frame);
  return write_all(config.control_fd, frame);
}

[[noreturn]] void run_template(const WorkerConfig& config) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // the launcher is gone: so is the sandbox
  // Never destroyed (the template leaves only through _exit): a plugin refused below is
  // not unloaded, so no thread it left running meets its code gone before the refusal
  // is said.
  ToolRegistry registry(CircuitBreaker::Options{});
  try {
    sandbox::seal();
    // Not even a process of the same user may open this one's /proc files (its memory,
    // its descriptors) or trace it; inherited by every call process.
    prctl(PR_SET_DUMPABLE, 0);
    sandbox::restrict_template();
    apply_process_limits(config.limits);
    config.load_tools(registry);
    // Plugin code ran while loading: nothing of it may live on beside the template, where
    // it would outlast every call and see every call process made.
    if (const int threads = sandbox::thread_count(); threads != 1) {
      throw ConfigError("a plugin started " + std::to_string(threads - 1) +
                        " thread(s) while loading; isolated plugins must not (they would outlive every call)");
    }
    if (::kill(-1, 0) == 0) {  // as init, -1 means every other process of the sandbox
      throw ConfigError("a plugin started a process while loading; isolated plugins must not");
    }
    stand_in_for_default_signal_actions();
    Hello hello;
    hello.tools = registry.list();
    std::string out;
    encode_hello(hello, out);
    if (!write_all(config.control_fd, out)) _exit(0);

    std::vector<CallProcess> children;
    std::vector<pollfd> fds;
    for (;;) {
      // Spares ready, and the calls they serve still running, make `children`; a child
      // that ends is replaced.
      while (children.size() < config.spares) {
        if (!make_call_process(config, registry, children)) _exit(0);
      }
      fds.assign(1, pollfd{config.control_fd, POLLIN, 0});
      for (const auto& c : children) fds.push_back(pollfd{c.pidfd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        throw ConfigError(std::string("poll failed: ") + std::strerror(errno));
      }
      if (fds[0].revents != 0) _exit(0);  // the host closed the socket (it sends nothing else)
      for (std::size_t i = children.size(); i-- > 0;) {
        if (fds[i + 1].revents == 0) continue;
        if (!reap(config, children[i])) _exit(0);
        children.erase(children.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
  } catch (const ConfigError& e) {
    complain(e.what());
    _exit(2);
  }
}

}  // namespace

int run_worker(const WorkerConfig& config) {
  struct sigaction sa{};
  sa.sa_handler = on_host_gone;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGHUP, &sa, nullptr);
  prctl(PR_SET_PDEATHSIG, SIGHUP);
  if (config.parent_pid != 0 && getppid() != config.parent_pid) return 1;  // the host died before prctl
  ::close_range(config.control_fd + 1, ~0U, 0);  // nothing of the host's beyond what it handed over

  // From here on the launcher leaves through _exit: the processes it starts go into the
  // sandbox's PID namespace, so nothing run at exit may start one (a leak checker's
  // helper, say, which fails once the template, that namespace's init, has ended).
  try {
    sandbox::enter(config.walls);
  } catch (const ConfigError& e) {
    complain(e.what());
    _exit(2);
  }
  const pid_t sandbox_init = fork();
  if (sandbox_init < 0) {
    complain(std::string("cannot start the sandbox: ") + std::strerror(errno));
    _exit(2);
  }
  if (sandbox_init == 0) run_template(config);
  ::close(config.control_fd);  // the template holds it: the host sees it close when the template ends

  int status = 0;
  while (waitpid(sandbox_init, &status, 0) < 0) {
    if (errno != EINTR) _exit(2);
  }
  if (WIFSIGNALED(status)) {    // ended the same way, so that the host can say how
    prctl(PR_SET_DUMPABLE, 0);  // (with no core file of its own: the launcher did not fail)
    signal(WTERMSIG(status), SIG_DFL);
    kill(getpid(), WTERMSIG(status));
    _exit(128 + WTERMSIG(status));
  }
  _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 2);
}

}  // namespace machina::worker
