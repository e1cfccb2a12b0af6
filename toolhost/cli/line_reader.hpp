// Bounded line reading from a file descriptor: a line longer than the cap is
// reported as too large as soon as the cap is passed and the rest of it is skipped,
// so no more than cap + one read chunk is ever buffered.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace machina::cli {

class LineReader {
 public:
  enum class Next { line, too_large, eof };
  static constexpr std::size_t kHeadBytes = 4096;

  /// Before a read that would block, polls for input for up to `spin` (see spin_wait.hpp).
  LineReader(int fd, std::size_t max_line, std::chrono::microseconds spin = {});

  /// The next line (without '\n'), valid until the following call and followed in
  /// memory by a '\0'. `before_block` runs right before a read that may block, so
  /// the caller can flush its output. A line too large comes as its first kHeadBytes at
  /// most (not followed by '\0'), which may name the request's id.
  Next next(std::string_view& line, const std::function<void()>& before_block);

 private:
  bool fill();  // false at end of input

  int fd_;
  std::size_t max_line_;
  std::chrono::microseconds spin_;
  std::vector<char> buf_;
  std::size_t begin_ = 0, end_ = 0, scan_ = 0;
  bool eof_ = false;
  bool skipping_ = false;  // inside the rest of an oversized line
};

/// Reads a whole input of at most `max_bytes`. Returns false (and stops reading)
/// as soon as the input is larger.
bool read_all_bounded(int fd, std::size_t max_bytes, std::string& out);

}  // namespace machina::cli
