// See process_worker_link.hpp.
#include "process_worker_link.hpp"

#include <machina/clock.hpp>
#include <machina/errors.hpp>
#include <machina/tool.hpp>

#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

namespace machina::worker_link {
namespace {

constexpr std::size_t kMaxHelloBytes = 64u << 20;

}  // namespace

int poll_timeout(std::int64_t deadline_ms) {
  const std::int64_t left = deadline_ms - steady_now_ms();
  if (left <= 0) return 0;
  return static_cast<int>(std::min<std::int64_t>(left, 1'000'000));
}

int wait_status(const worker::Ended& e) {
  if (e.code == CLD_EXITED) return (e.status & 0xff) << 8;
  return (e.status & 0x7f) | (e.code == CLD_DUMPED ? 0x80 : 0);
}

bool handle_control(ProcessRunner::Worker& w, const std::vector<std::string>* expected, std::string& why) {
  std::size_t at = 0;
  while (w.cbuf.size() - at >= worker::kFrameHeader) {
    std::uint32_t size = 0;
    worker::FrameType type{};
    worker::read_header(std::string_view(w.cbuf).substr(at), size, type);
    if (size > kMaxHelloBytes) {
      why = "sent an oversized control frame";
      return false;
    }
    if (w.cbuf.size() - at < worker::kFrameHeader + size) break;
    const std::string_view payload = std::string_view(w.cbuf).substr(at + worker::kFrameHeader, size);
    at += worker::kFrameHeader + size;
    if (type == worker::FrameType::hello && !w.greeted) {
      worker::Hello hello;
      if (!worker::decode_hello(payload, hello)) {
        why = "sent a malformed greeting";
        return false;
      }
      std::vector<std::string> aids;
      for (const auto& t : hello.tools) aids.push_back(t.aid);
      std::sort(aids.begin(), aids.end());
      if (expected != nullptr && aids != *expected) {
        why = "registered other tools than the host (plugins changed on disk?)";
        return false;
      }
      w.tools = std::move(hello.tools);
      w.greeted = true;
    } else if (type == worker::FrameType::ready && w.greeted) {
      worker::Ready ready;
      if (!worker::decode_ready(payload, ready) || w.fds.size() < worker::kReadyFds) {
        why = "sent a malformed control frame";
        return false;
      }
      CallProcess p;
      p.pid = ready.pid;
      for (int* fd : {&p.call, &p.call_keep, &p.result, &p.pidfd}) {
        *fd = w.fds.front();
        w.fds.pop_front();
      }
      set_nonblocking(p.call);
      set_nonblocking(p.result);
      w.ready.push_back(p);
    } else if (type == worker::FrameType::ended && w.greeted) {
      worker::Ended ended;
      if (!worker::decode_ended(payload, ended)) {
        why = "sent a malformed control frame";
        return false;
      }
      if (ended.pid == w.watching) w.end_seen = ended;
    } else {
      why = w.greeted ? "sent an unexpected control frame" : "sent something other than its greeting";
      return false;
    }
  }
  w.cbuf.erase(0, at);
  return true;
}

Pump pump(ProcessRunner::Worker& w, const std::vector<std::string>* expected, std::int64_t deadline_ms,
          std::string& why) {
  pollfd fds[2] = {{w.control, POLLIN, 0}, {w.process->output_fd(), POLLIN, 0}};
  const int n = ::poll(fds, 2, poll_timeout(deadline_ms));
  if (n < 0) {
    if (errno == EINTR) return Pump::more;
    why = std::string("poll failed: ") + std::strerror(errno);
    return Pump::lost;
  }
  if (n == 0) return Pump::timed_out;
  if (fds[1].revents) w.process->read_output();
  if (!fds[0].revents) return Pump::more;
  char data[4096];
  alignas(cmsghdr) char control[CMSG_SPACE(64 * sizeof(int))];
  iovec iov{data, sizeof data};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  const ssize_t got = ::recvmsg(w.control, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  if (got < 0) {
    // (nothing was received: the control buffer is not to be read)
    if (errno == EAGAIN || errno == EINTR) return Pump::more;
    why = std::string("could not be read from: ") + std::strerror(errno);
    return Pump::lost;
  }
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      w.fds.push_back(fd);
    }
  }
  if (got == 0) return Pump::ended;
  if (msg.msg_flags & MSG_CTRUNC) {
    why = "sent more descriptors than expected";
    return Pump::lost;
  }
  w.cbuf.append(data, static_cast<std::size_t>(got));
  return handle_control(w, expected, why) ? Pump::more : Pump::lost;
}

bool ended_while_idle(const ProcessRunner::Worker& w) {
  if (w.process->exited()) return true;
  pollfd fd{w.control, POLLIN | POLLRDHUP, 0};
  return ::poll(&fd, 1, 0) == 1 && (fd.revents & (POLLHUP | POLLRDHUP | POLLERR)) != 0;
}

std::string end_worker(ProcessRunner::Worker& w, bool sandbox_ended) {
  constexpr std::chrono::milliseconds kLauncherExit{2'000};  // to reap the sandbox and end as it did
  if (sandbox_ended) w.process->wait_exit(kLauncherExit);
  return w.process->end();
}

}  // namespace machina::worker_link
