// What a child process writes to its stdout, read as records (lines, NUL-ended names) until
// its stdout closes, its deadline passes, or the reader stops: ripgrep's listing and its
// matches are read this way.
#pragma once

#include <machina/child_process.hpp>
#include <machina/clock.hpp>

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace machina::packs {

/// How reading a child's records ended.
enum class RecordsEnd {
  closed,     // its stdout closed (or cannot be polled)
  stopped,    // `take` or `stop` said stop
  timed_out,  // the deadline passed
};

/// Reads `proc`'s stdout, handing each record that ends in `separator` (without it) to
/// `take`, which returns false to stop reading. `stop()` is asked before each wait, and a
/// wait lasts at most `look_ms`. A record longer than `max_record` bytes is dropped.
template <class Stop, class Take>
RecordsEnd read_records(ChildProcess& proc, char separator, std::size_t max_record, std::int64_t deadline_ms,
                        int look_ms, Stop&& stop, Take&& take) {
  std::string buffer;
  char chunk[65536];
  for (;;) {
    if (stop()) return RecordsEnd::stopped;
    const std::int64_t left = deadline_ms - steady_now_ms();
    if (left <= 0) return RecordsEnd::timed_out;
    pollfd p{proc.stdout_fd(), POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left, look_ms)));
    if (n < 0 && errno != EINTR) return RecordsEnd::closed;
    if (n <= 0) continue;
    for (;;) {
      const ssize_t got = ::read(proc.stdout_fd(), chunk, sizeof chunk);
      if (got > 0) {
        buffer.append(chunk, static_cast<std::size_t>(got));
        std::size_t at = 0;
        for (std::size_t end; (end = buffer.find(separator, at)) != std::string::npos; at = end + 1) {
          if (!take(std::string_view(buffer).substr(at, end - at))) return RecordsEnd::stopped;
        }
        buffer.erase(0, at);
        if (buffer.size() > max_record) buffer.clear();
        continue;
      }
      if (got == 0) return RecordsEnd::closed;
      if (errno == EINTR) continue;
      break;
    }
  }
}

}  // namespace machina::packs
