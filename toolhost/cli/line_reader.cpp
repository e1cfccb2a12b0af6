// See line_reader.hpp.
#include "line_reader.hpp"

#include <unistd.h>
#include <machina/spin_wait.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace machina::cli {

namespace {
constexpr std::size_t kChunk = 256 * 1024;
}

// The buffer keeps one byte beyond what read() may fill, for the '\0' after a last
// line that has no newline.
LineReader::LineReader(int fd, std::size_t max_line, std::chrono::microseconds spin)
    : fd_(fd), max_line_(max_line), spin_(spin) {
  buf_.resize(kChunk + 1);
}

bool LineReader::fill() {
  if (eof_) return false;
  if (begin_ > 0 && (end_ == buf_.size() - 1 || begin_ >= buf_.size() / 2)) {
    std::memmove(buf_.data(), buf_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    scan_ -= begin_;
    begin_ = 0;
  }
  if (end_ == buf_.size() - 1) {
    // Only a line still under the cap grows the buffer, so it stays below cap + chunk.
    buf_.resize(std::min(buf_.size() * 2, max_line_ + kChunk + 1));
  }
  spin_until_readable(fd_, spin_);  // a lock-step client's next request often comes within microseconds
  for (;;) {
    const ssize_t n = ::read(fd_, buf_.data() + end_, buf_.size() - 1 - end_);
    if (n > 0) {
      end_ += static_cast<std::size_t>(n);
      return true;
    }
    if (n < 0 && errno == EINTR) continue;
    eof_ = true;  // end of input, or an unreadable stream: finish what we have
    return false;
  }
}

LineReader::Next LineReader::next(std::string_view& line, const std::function<void()>& before_block) {
  for (;;) {
    if (skipping_) {
      const char* nl = static_cast<const char*>(std::memchr(buf_.data() + begin_, '\n', end_ - begin_));
      if (nl != nullptr) {
        begin_ = scan_ = static_cast<std::size_t>(nl - buf_.data()) + 1;
        skipping_ = false;
        continue;
      }
      begin_ = end_ = scan_ = 0;
      before_block();
      if (!fill()) return Next::eof;
      continue;
    }
    const char* nl = static_cast<const char*>(std::memchr(buf_.data() + scan_, '\n', end_ - scan_));
    if (nl != nullptr) {
      const std::size_t len = static_cast<std::size_t>(nl - buf_.data()) - begin_;
      buf_[begin_ + len] = '\0';
      line = std::string_view(buf_.data() + begin_, len > max_line_ ? std::min(len, kHeadBytes) : len);
      begin_ = scan_ = begin_ + len + 1;
      return len > max_line_ ? Next::too_large : Next::line;
    }
    scan_ = end_;
    if (end_ - begin_ > max_line_) {
      skipping_ = true;
      line = std::string_view(buf_.data() + begin_, std::min(end_ - begin_, kHeadBytes));  // (kept until the next read)
      begin_ = end_ = scan_ = 0;
      return Next::too_large;
    }
    if (eof_) {
      if (begin_ == end_) return Next::eof;
      buf_[end_] = '\0';
      line = std::string_view(buf_.data() + begin_, end_ - begin_);
      begin_ = scan_ = end_;
      return Next::line;
    }
    before_block();
    fill();
  }
}

bool read_all_bounded(int fd, std::size_t max_bytes, std::string& out) {
  out.clear();
  char chunk[64 * 1024];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n == 0) return true;
    if (n < 0) {
      if (errno == EINTR) continue;
      return true;
    }
    if (out.size() + static_cast<std::size_t>(n) > max_bytes) return false;
    out.append(chunk, static_cast<std::size_t>(n));
  }
}

}  // namespace machina::cli
