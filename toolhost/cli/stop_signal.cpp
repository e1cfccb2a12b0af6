// SIGINT and SIGTERM as a readable eventfd.
#include "stop_signal.hpp"

#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>

namespace machina::cli {

namespace {

int g_stop_fd = -1;  // written once per signal; never closed (the handler may run at any time)

void on_stop_signal(int) {
  const std::uint64_t one = 1;
  if (g_stop_fd >= 0) (void)!::write(g_stop_fd, &one, sizeof one);
}

}  // namespace

int watch_stop_signals() {
  if (g_stop_fd >= 0) return g_stop_fd;
  g_stop_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  struct sigaction sa{};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  return g_stop_fd;
}

int stop_fd_of(const FrontControl& control) {
  return control.stop_fd >= 0 ? control.stop_fd : watch_stop_signals();
}

}  // namespace machina::cli
