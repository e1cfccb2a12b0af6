// Whole writes to a file descriptor: a short write is continued and an interrupted one
// retried, so a caller sees all of its bytes written or an error; and the small chores
// around a descriptor. Async-signal-safe (write, fcntl, close and errno only): signal
// handlers use it too.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <string_view>

namespace machina {

/// Writes `size` bytes from `data` to `fd`: how many were written. Fewer than `size` when
/// a write failed; errno then says why (ENOSPC when a write took nothing without an error).
inline std::size_t write_fully(int fd, const void* data, std::size_t size) noexcept {
  const char* p = static_cast<const char*>(data);
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, p + done, size - done);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      if (n == 0) errno = ENOSPC;
      break;
    }
  }
  return done;
}

/// Writes all of `data` to `fd`: false when a write failed (errno says why).
inline bool write_all(int fd, std::string_view data) noexcept {
  return write_fully(fd, data.data(), data.size()) == data.size();
}

/// Puts `fd` in non-blocking mode.
inline void set_nonblocking(int fd) noexcept {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/// Closes `fd` if open and marks it closed.
inline void close_fd(int& fd) noexcept {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace machina
