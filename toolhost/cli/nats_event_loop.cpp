// See nats_event_loop.hpp.
#include "nats_event_loop.hpp"

#include <machina/errors.hpp>

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <utility>

namespace machina::cli {
namespace {

constexpr std::uint32_t kStopTag = 0, kSocketTag = 1, kPokeTag = 2;

// The calling thread publishes under a Held; the client asked for a write while it did.
thread_local bool t_held = false;
thread_local bool t_write_asked = false;

}  // namespace

NatsEventLoop::NatsEventLoop() {
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  poke_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epoll_fd_ < 0 || stop_fd_ < 0 || poke_fd_ < 0)
    throw ConfigError("--nats: cannot make the connection's event loop");
  for (const auto& [fd, tag] : {std::pair{stop_fd_, kStopTag}, std::pair{poke_fd_, kPokeTag}}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u32 = tag;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  }
}

NatsEventLoop::~NatsEventLoop() {
  stop();
  ::close(poke_fd_);
  ::close(stop_fd_);
  ::close(epoll_fd_);
}

natsStatus NatsEventLoop::attach_to(natsOptions* opts, std::function<void()> after_read) {
  after_read_ = std::move(after_read);
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  return natsOptions_SetEventLoop(opts, this, on_attach, on_read, on_write, on_detach);
}

void NatsEventLoop::stop() {
  if (!thread_.joinable()) return;
  const std::uint64_t one = 1;
  (void)!::write(stop_fd_, &one, sizeof one);
  thread_.join();
}

void NatsEventLoop::poke() {
  const std::uint64_t one = 1;
  (void)!::write(poke_fd_, &one, sizeof one);
}

void NatsEventLoop::run() {
  epoll_event events[4];
  for (;;) {
    const int n = ::epoll_wait(epoll_fd_, events, 4, -1);
    if (n < 0 && errno != EINTR) return;
    bool read = false;
    for (int i = 0; i < n; ++i) {
      const std::uint32_t tag = events[i].data.u32;
      if (tag == kStopTag) return;
      if (tag == kPokeTag) {
        std::uint64_t count;
        (void)!::read(poke_fd_, &count, sizeof count);
        read = true;
        continue;
      }
      natsConnection* nc = nc_.load();
      if (events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
        natsConnection_ProcessReadEvent(nc);
        read = true;
      }
      if (events[i].events & EPOLLOUT) write_buffered(nc);
    }
    if (read && after_read_) after_read_();
  }
}

bool NatsEventLoop::write_buffered(natsConnection* nc) {
  // The client takes an empty write for a closed connection: only one thread writes at a
  // time, and only what there is.
  std::lock_guard lock(write_mu_);
  if (natsConnection_Buffered(nc) <= 0) return true;
  natsConnection_ProcessWriteEvent(nc);
  return natsConnection_Buffered(nc) <= 0;
}

void NatsEventLoop::watch() {
  const std::uint32_t events = (reading_ ? EPOLLIN : 0u) | (writing_ ? EPOLLOUT : 0u);
  if (registered_fd_ >= 0 && (registered_fd_ != fd_ || events == 0)) {
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, registered_fd_, nullptr);  // (gone already if the client closed it)
    registered_fd_ = -1;
  }
  if (fd_ < 0 || events == 0) return;
  epoll_event ev{};
  ev.events = events;
  ev.data.u32 = kSocketTag;
  if (registered_fd_ == fd_) {
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd_, &ev);
  } else if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd_, &ev) == 0 || errno == EEXIST) {
    if (errno == EEXIST) ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd_, &ev);
    registered_fd_ = fd_;
  }
}

void NatsEventLoop::want_write() {
  std::lock_guard lock(mu_);
  if (writing_) return;
  writing_ = true;
  watch();
}

natsStatus NatsEventLoop::on_attach(void** user, void* loop, natsConnection* nc, natsSock fd) {
  auto* self = static_cast<NatsEventLoop*>(loop);
  self->nc_.store(nc);
  {
    std::lock_guard lock(self->mu_);
    self->fd_ = fd;
    self->reading_ = true;
    self->writing_ = false;
    self->watch();
  }
  *user = self;
  return NATS_OK;
}

natsStatus NatsEventLoop::on_read(void* user, bool add) {
  auto* self = static_cast<NatsEventLoop*>(user);
  std::lock_guard lock(self->mu_);
  self->reading_ = add;
  self->watch();
  return NATS_OK;
}

natsStatus NatsEventLoop::on_write(void* user, bool add) {
  auto* self = static_cast<NatsEventLoop*>(user);
  if (add && t_held) {
    t_write_asked = true;  // the publishing thread settles it
    return NATS_OK;
  }
  std::lock_guard lock(self->mu_);
  self->writing_ = add;
  self->watch();
  return NATS_OK;
}

natsStatus NatsEventLoop::on_detach(void* user) {
  auto* self = static_cast<NatsEventLoop*>(user);
  std::lock_guard lock(self->mu_);
  self->fd_ = -1;
  self->reading_ = self->writing_ = false;
  self->watch();
  return NATS_OK;
}

NatsEventLoop::Held::Held(NatsEventLoop& loop) : loop_(loop) {
  t_held = true;
  t_write_asked = false;
}

NatsEventLoop::Held::~Held() {
  t_held = false;
  if (t_write_asked) loop_.want_write();
  t_write_asked = false;
}

void NatsEventLoop::Held::settle(natsConnection* nc, bool last) {
  t_held = false;
  if (!t_write_asked) return;  // another thread's write takes this reply along
  t_write_asked = false;
  if (last && loop_.write_buffered(nc)) return;  // (all written: the client asked to stop writing)
  loop_.want_write();
}

}  // namespace machina::cli
