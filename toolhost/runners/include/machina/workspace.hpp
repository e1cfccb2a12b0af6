// Files under one workspace directory, for the built-in file tools: a path given by a
// caller is resolved component by component beneath the workspace's directory descriptor,
// following no symbolic link (openat2 with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS where the
// kernel has it, an O_NOFOLLOW walk that holds each directory otherwise), so that no link,
// swapped directory or trick in the path leads outside. Only regular files with a single
// link are opened (a hard link may be a way out; a FIFO would hang the caller); missing
// directories are made only for a write that then succeeds.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace machina::workspace {

inline constexpr std::size_t kMaxDepth = 64;  // components in a path

/// How paths are resolved: openat2 when the kernel has it (the walk otherwise), or the
/// walk alone (what a kernel before 5.6, or a filter that refuses openat2, gets).
enum class Resolver { automatic, walk };

/// An open descriptor, closed with its owner.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept;
  ~Fd();
  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

/// The parts of a workspace-relative path, or the reason it is refused (empty, absolute,
/// a NUL byte, a `..`, a component longer than NAME_MAX, more than kMaxDepth components).
/// Empty and `.` components are dropped.
bool split(std::string_view path, std::vector<std::string>& parts, std::string& why);

class Workspace {
 public:
  /// Opens the workspace directory: `root` (an operator's symlinked root is fine).
  /// Fails (false, with why) if it cannot be opened as a directory.
  bool open(const std::string& root, std::string& why, Resolver resolver = Resolver::automatic);

  /// Opens an existing regular file for reading. -1 with why if refused or missing.
  Fd open_for_reading(const std::vector<std::string>& parts, std::string& why) const;

  /// Writes `content` to a regular file (made if missing, with the directories it needs;
  /// truncated first unless `append`). False with why if refused or failed; then nothing
  /// that this call made is left behind (not the file, not a directory).
  bool write(const std::vector<std::string>& parts, std::string_view content, bool append, std::string& why) const;

  /// Opens an existing directory (O_PATH; `parts` empty: the workspace itself). -1 with why.
  Fd open_dir(const std::vector<std::string>& parts, std::string& why) const {
    return open_directory(parts, parts.size(), nullptr, why);
  }

  /// Removes a regular file or a symbolic link (the link itself). False with why if
  /// refused (a directory, a FIFO, a device ...) or missing.
  bool remove(const std::vector<std::string>& parts, std::string& why) const;

 private:
  /// A directory this call made: its name in its parent, whose descriptor is kept so that
  /// removing it again never goes through a path that may have changed meanwhile.
  struct Made {
    Fd parent;
    std::string name;
  };
  /// The directory at parts[0 .. count), made where missing when `made` is given (each
  /// directory made is recorded, outermost first).
  Fd open_directory(const std::vector<std::string>& parts, std::size_t count, std::vector<Made>* made,
                    std::string& why) const;

  Fd root_;
  Resolver resolver_ = Resolver::automatic;
};

}  // namespace machina::workspace
