// See process_runner.hpp. One call at a time per worker; the calling thread does the I/O
// with the call's own process itself (non-blocking, poll with the call's deadline), passing
// on what the worker writes to stderr and keeping its tail for crash reports. The worker's
// control socket brings its greeting (the tools it registered), call processes (their
// pipes as SCM_RIGHTS) and news of their end.
#include "process_worker_link.hpp"

#include <machina/clock.hpp>
#include <machina/errors.hpp>
#include <machina/isolation/worker_protocol.hpp>
#include <machina/json_text.hpp>
#include <machina/runners/process_runner.hpp>
#include <machina/tool.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <optional>

namespace machina {

using namespace worker_link;

namespace {

constexpr std::size_t kMaxSlotLabelBytes = 64 * 1024;  // an artifact's type or provenance
constexpr std::int64_t kEndWaitMs = 2'000;             // for a killed call process to be gone, or its end reported

}  // namespace

ProcessRunner::ProcessRunner(ProcessRunnerOptions options) : options_(std::move(options)) {
  if (options_.executable.empty()) throw ConfigError("process isolation needs the machina-toolhost executable");
  if (access(options_.executable.c_str(), X_OK) != 0) {
    throw ConfigError("process isolation: cannot run " + options_.executable + ": " + std::strerror(errno));
  }
  if (options_.size == 0) options_.size = 1;
  if (options_.spares == 0) options_.spares = 1;
  std::vector<std::string> names(std::begin(kWorkerEnvironment), std::end(kWorkerEnvironment));
  for (const auto& name : options_.pass_env) {
    if (name.starts_with("MACHINA_LEASE_"))
      throw ConfigError("the lease variables are never passed to workers: " + name);
    if (name.empty() || name.find('=') != std::string::npos)
      throw ConfigError("not an environment variable name: '" + name + "'");
    names.push_back(name);
  }
  env_ = pick_environment(names);
  max_result_bytes_ = worker::kFrameHeader + 64 + options_.max_output_bytes + kMaxToolErrorBytes +
                      kDsSlots * (options_.max_output_bytes + 2 * kMaxSlotLabelBytes + 64);
}

ProcessRunner::~ProcessRunner() {
  std::lock_guard lock(mu_);
  idle_.clear();  // each ends its worker
}

void ProcessRunner::add_linked(const std::vector<ToolInfo>& tools) {
  std::lock_guard lock(mu_);
  if (started_) throw ConfigError("the built-in tools cannot be added after the isolated workers have started");
  plugins_.emplace_back();  // "" stands for the linked tools
  for (const auto& t : tools) aids_.push_back(t.aid);
}

void ProcessRunner::close() {
  std::vector<std::unique_ptr<Worker>> idle;
  {
    std::lock_guard lock(mu_);
    closing_ = true;
    idle.swap(idle_);
    live_ -= idle.size();
    for (pid_t pid : busy_) {
      // The call running in it ends with the sandbox: its caller sees the pipes close.
      ::kill(-pid, SIGKILL);
      ::kill(pid, SIGKILL);
    }
    freed_.notify_all();
  }
}

ProcessRunner::Stats ProcessRunner::stats() const {
  std::lock_guard lock(mu_);
  Stats s = stats_;
  s.live = live_;
  return s;
}

std::unique_ptr<ProcessRunner::Worker> ProcessRunner::acquire(std::int64_t deadline_ms, std::string& why,
                                                              bool& timed_out) {
  timed_out = false;
  {
    std::unique_lock lock(mu_);
    const auto until = std::chrono::steady_clock::time_point(std::chrono::milliseconds(deadline_ms));
    while (!closing_ && idle_.empty() && live_ >= options_.size) {
      if (freed_.wait_until(lock, until) == std::cv_status::timeout && idle_.empty() && live_ >= options_.size) {
        timed_out = true;
        why = "no worker became free before the deadline";
        return nullptr;
      }
    }
    if (closing_) {
      why = "the host is closed";
      return nullptr;
    }
    if (!idle_.empty()) {
      auto w = std::move(idle_.back());
      idle_.pop_back();
      busy_.push_back(w->pid());
      return w;
    }
    ++live_;
    if (!started_) {  // the lists of plugins and tools are fixed from now on
      started_ = true;
      std::sort(aids_.begin(), aids_.end());
    }
  }
  auto w = start_worker(plugins_, &aids_, deadline_ms, why);
  std::lock_guard lock(mu_);
  if (w) ++stats_.started;
  if (!w) {
    --live_;
    freed_.notify_one();
  } else if (closing_) {
    why = "the host is closed";
    --live_;
    return nullptr;
  } else {
    busy_.push_back(w->pid());
  }
  return w;
}

void ProcessRunner::release(std::unique_ptr<Worker> worker) {
  std::lock_guard lock(mu_);
  std::erase(busy_, worker->pid());
  if (closing_) {
    --live_;
    return;
  }
  idle_.push_back(std::move(worker));
  freed_.notify_one();
}

void ProcessRunner::retire(std::unique_ptr<Worker> worker) {
  if (worker->process) worker->process->end();
  std::lock_guard lock(mu_);
  std::erase(busy_, worker->pid());
  --live_;
  freed_.notify_one();
}

RunOutcome ProcessRunner::run(const RunSpec& spec) {
  using Ending = RunOutcome::Ending;
  const std::int64_t deadline_ms = spec.deadline_ms;
  CallContext& call = spec.call;
  RunOutcome out;
  std::string why;
  bool queue_timeout = false;
  std::unique_ptr<Worker> w = acquire(deadline_ms, why, queue_timeout);
  // A worker that ended while idle (killed from outside, say) costs no call: nothing was
  // sent to it yet, so the call goes to a fresh one. The call processes it had made ready
  // die with it (they are its children, with PDEATHSIG).
  for (std::size_t tries = 0; w && tries <= options_.size && ended_while_idle(*w); ++tries) {
    {
      std::lock_guard lock(mu_);
      ++stats_.lost_idle;
    }
    retire(std::move(w));
    w = acquire(deadline_ms, why, queue_timeout);
  }
  auto closing = [&] {
    std::lock_guard lock(mu_);
    return closing_;
  };
  if (!w) {
    out.ending = queue_timeout ? Ending::timed_out : closing() ? Ending::closed : Ending::crashed;
    out.detail = why;
    return out;
  }
  // The worker is lost: every call process it made goes with it.
  auto lose = [&](const std::string& fail, bool sandbox_ended) {
    const std::string how = end_worker(*w, sandbox_ended);
    const std::string tail = w->process->tail();
    out.ending = closing() ? Ending::closed : Ending::crashed;
    out.detail = (fail.empty() ? std::string() : fail + "; ") + "the worker process " + how;
    if (!tail.empty()) out.detail += "; its last stderr: " + tail;
    retire(std::move(w));
    return out;
  };

  // Nothing of the previous call may still run when this one starts: its process was
  // killed when its answer came (or its deadline passed), and its end is the end of
  // everything it started (the kernel ends a PID namespace with its init).
  if (w->last.pidfd >= 0) {
    pollfd gone{w->last.pidfd, POLLIN, 0};
    if (::poll(&gone, 1, static_cast<int>(kEndWaitMs)) != 1)
      return lose("the previous call's process did not end", false);
    w->last.close_all();
  }
  w->process->clear_tail();  // a crash report shows what this call wrote
  while (w->ready.empty()) {
    const Pump p = pump(*w, &aids_, deadline_ms, why);
    if (p == Pump::ended) return lose("", true);
    if (p == Pump::lost) return lose(why, false);
    if (p == Pump::timed_out) {
      out.ending = Ending::timed_out;
      out.detail = "no call process was ready before the deadline";
      release(std::move(w));
      return out;
    }
  }
  CallProcess p = w->ready.front();
  w->ready.pop_front();
  {
    std::lock_guard lock(mu_);
    ++stats_.calls;
  }

  std::string& frame = w->wbuf;
  frame.clear();
  const Slots& state = call.state();
  bool any_state = false;
  for (const auto& slot : state) any_state = any_state || slot.has_value();
  worker::encode_call(spec.tool.info.aid, spec.input_json, any_state ? &state : nullptr, frame);
  // Most frames fit the pipe: write at once, poll only for what is left.
  std::size_t sent = 0;
  if (const ssize_t put = ::write(p.call, frame.data(), frame.size()); put > 0) sent = static_cast<std::size_t>(put);
  // A caller that may cancel wakes the wait below through an eventfd.
  int cancel_fd = -1;
  if (spec.cancel != nullptr) {
    cancel_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (cancel_fd >= 0) {
      spec.cancel->on_cancel([cancel_fd] {
        const std::uint64_t one = 1;
        (void)!::write(cancel_fd, &one, sizeof one);
      });
    }
  }
  struct CancelWake {
    CancelToken* token;
    int fd;
    ~CancelWake() {
      if (fd < 0) return;
      token->on_cancel(nullptr);
      ::close(fd);
    }
  } cancel_wake{spec.cancel, cancel_fd};
  bool cancelled = false;
  std::string& buf = w->rbuf;
  std::size_t have = 0;    // bytes of the reply in buf
  std::uint32_t want = 0;  // payload size once the header is in
  worker::FrameType type{};
  bool have_header = false;
  bool timed_out = false, eof = false;
  std::string fail;  // a reply that cannot be trusted

  for (;;) {
    if (!have_header && have >= worker::kFrameHeader) {
      worker::read_header(std::string_view(buf.data(), have), want, type);
      if ((type != worker::FrameType::result && type != worker::FrameType::died) || want > max_result_bytes_) {
        fail = "the worker sent a malformed reply";
        break;
      }
      have_header = true;
    }
    if (have_header && have >= worker::kFrameHeader + want) break;

    pollfd fds[4] = {{p.result, POLLIN, 0},
                     {w->process->output_fd(), POLLIN, 0},
                     {sent < frame.size() ? p.call : -1, POLLOUT, 0},
                     {cancel_fd, POLLIN, 0}};
    const int n = ::poll(fds, 4, poll_timeout(deadline_ms));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail = std::string("poll failed: ") + std::strerror(errno);
      break;
    }
    if (n == 0) {
      timed_out = true;
      break;
    }
    if (fds[3].revents & POLLIN) {
      cancelled = true;
      break;
    }
    if (fds[1].revents) w->process->read_output();
    if ((fds[2].revents & (POLLOUT | POLLERR)) && sent < frame.size()) {
      const ssize_t put = ::write(p.call, frame.data() + sent, frame.size() - sent);
      if (put > 0)
        sent += static_cast<std::size_t>(put);
      else if (put < 0 && errno != EAGAIN && errno != EINTR)
        sent = frame.size();  // it stopped reading: see below
    }
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      // Up to the end of the frame once its size is known (at most 1 MiB more at a time).
      const std::size_t end =
          std::min<std::size_t>(have_header ? worker::kFrameHeader + want : have + 64 * 1024, have + (1u << 20));
      if (buf.size() < end) buf.resize(end);
      const ssize_t got = ::read(p.result, buf.data() + have, end - have);
      if (got > 0) have += static_cast<std::size_t>(got);
      if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
        eof = true;
        break;
      }
    }
  }
  // The call is over, whatever the process does next (it may have answered early and run
  // on): it is killed, and the next call waits until it is gone.
  p.kill();
  p.close_pipes();
  w->last = p;

  if (timed_out || cancelled) {
    if (timed_out) {
      std::lock_guard lock(mu_);
      ++stats_.timed_out;
    }
    release(std::move(w));
    out.ending = timed_out ? Ending::timed_out : Ending::cancelled;
    out.detail = cancelled ? "its process was killed" : "";
    return out;
  }
  worker::Result result;
  std::int32_t died = 0;
  if (fail.empty() && !eof) {
    const std::string_view payload = std::string_view(buf).substr(worker::kFrameHeader, want);
    if (type == worker::FrameType::died) {
      if (!worker::decode_died(payload, died) || died <= 0 || died > 64) fail = "the worker sent a malformed reply";
    } else if (!worker::decode_result(payload, result)) {
      fail = "the worker sent a malformed reply";
    }
  }
  if (!fail.empty() || eof || died != 0) {
    // How the call's process ended: what it said itself, else what its worker saw.
    std::string how;
    if (died != 0) {
      how = describe_wait_status(died);
    } else {
      w->watching = p.pid;
      w->end_seen.reset();
      const std::int64_t until = steady_now_ms() + kEndWaitMs;
      while (!w->end_seen) {
        const Pump got = pump(*w, &aids_, until, why);
        if (got == Pump::ended) return lose(fail, true);
        if (got == Pump::lost) return lose(fail.empty() ? why : fail, false);
        if (got == Pump::timed_out) break;
      }
      w->watching = 0;
      how = w->end_seen ? describe_wait_status(wait_status(*w->end_seen)) : "did not say how it ended";
    }
    {
      std::lock_guard lock(mu_);
      ++stats_.crashed;
    }
    out.ending = Ending::crashed;
    out.detail = (fail.empty() ? std::string() : fail + "; ") + "the worker process " + how;
    if (const std::string tail = w->process->tail(); !tail.empty()) out.detail += "; its last stderr: " + tail;
    release(std::move(w));
    return out;
  }
  if (buf.capacity() > (1u << 20)) buf = std::string();  // large buffers are not kept
  if (frame.capacity() > (1u << 20)) frame = std::string();
  release(std::move(w));

  // What comes back was produced next to tool code: check it as the inline host checks
  // what a tool hands over.
  out.rc = result.rc;
  call.output_overflow = result.output_overflow || result.output.size() > call.max_output;
  call.output_set = result.output_set && !call.output_overflow;
  if (call.output_set) call.output = std::move(result.output);
  call.error = to_valid_utf8(std::string_view(result.error).substr(0, kMaxToolErrorBytes));
  if (result.changes.set != 0 || result.changes.removed != 0) {
    for (std::size_t i = 0; i < kDsSlots; ++i) {
      if (!(result.changes.set & (1u << i))) continue;
      const Artifact& a = *result.changes.slots[i];
      if (a.content_json.size() > call.max_output || a.type.size() > kMaxSlotLabelBytes ||
          a.provenance.size() > kMaxSlotLabelBytes || !is_valid_utf8(a.type) || !is_valid_utf8(a.provenance) ||
          !validate_json(a.content_json)) {
        out.rc = MACHINA_TOOL_FAULT;
        call.error = "the worker reported an invalid ds_state slot";
        return out;
      }
    }
    call.writes() = std::move(result.changes);
  }
  return out;
}

}  // namespace machina
