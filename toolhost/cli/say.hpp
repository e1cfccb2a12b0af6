// machina-toolhost's own lines on stderr.
#pragma once

#include <unistd.h>

#include <string>
#include <string_view>

namespace machina::cli {

/// Writes "machina-toolhost: TEXT\n" to stderr in one write (whole, among other threads'
/// lines; nothing buffered is left behind by a quick exit).
inline void say(std::string_view text) {
  std::string line = "machina-toolhost: ";
  line.append(text).push_back('\n');
  (void)!::write(STDERR_FILENO, line.data(), line.size());
}

}  // namespace machina::cli
