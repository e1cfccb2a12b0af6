// See workspace.hpp.
#include <machina/workspace.hpp>

#include <machina/fd_io.hpp>

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>

namespace machina::workspace {
namespace {

std::string errno_text(int e) {
  return std::strerror(e);
}

// Whether openat2 works here: unknown until tried; a kernel without it (ENOSYS), or a
// seccomp filter that refuses it (EPERM, or ENOSYS), makes every later call walk.
std::atomic<int> g_openat2{0};  // 0 unknown, 1 works, -1 not available

int openat2_beneath(int dir, const std::string& path, std::uint64_t flags) {
  open_how how{};
  how.flags = flags | O_CLOEXEC;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  const long fd = ::syscall(SYS_openat2, dir, path.c_str(), &how, sizeof how);
  if (fd >= 0) {
    g_openat2.store(1, std::memory_order_relaxed);
  } else if (errno == ENOSYS || (errno == EPERM && g_openat2.load(std::memory_order_relaxed) == 0) ||
             (errno == E2BIG && g_openat2.load(std::memory_order_relaxed) == 0)) {
    g_openat2.store(-1, std::memory_order_relaxed);
    errno = ENOSYS;
  }
  return static_cast<int>(fd);
}

std::string join(const std::vector<std::string>& parts, std::size_t count) {
  std::string path;
  for (std::size_t i = 0; i < count; ++i) {
    if (i > 0) path.push_back('/');
    path += parts[i];
  }
  return path;
}

/// Why `name` in `dir` could not be opened as it had to be: a link, another kind of file,
/// or the error itself.
std::string explain(int dir, const std::string& name, int error, const char* wanted) {
  struct stat st{};
  if (::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    if (S_ISLNK(st.st_mode)) return "a symbolic link is in the way (links are not followed in the workspace)";
    if (std::strcmp(wanted, "a directory") == 0 && !S_ISDIR(st.st_mode)) return "a part of it is not a directory";
    if (std::strcmp(wanted, "a regular file") == 0 && !S_ISREG(st.st_mode)) return "not a regular file";
  }
  return errno_text(error);
}

/// A regular file with a single link, or why not.
bool acceptable(int fd, std::string& why) {
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    why = errno_text(errno);
    return false;
  }
  if (!S_ISREG(st.st_mode)) {
    why = "not a regular file";
    return false;
  }
  if (st.st_nlink > 1) {
    why = "it has more than one hard link (a hard link may lead out of the workspace)";
    return false;
  }
  return true;
}

}  // namespace

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

bool split(std::string_view path, std::vector<std::string>& parts, std::string& why) {
  parts.clear();
  if (path.empty()) {
    why = "path must not be empty";
    return false;
  }
  if (path.find('\0') != std::string_view::npos) {
    why = "path must not contain a NUL character";
    return false;
  }
  if (path.front() == '/') {
    why = "path must be relative to the workspace";
    return false;
  }
  std::size_t start = 0;
  while (start <= path.size()) {
    const std::size_t slash = std::min(path.find('/', start), path.size());
    const std::string_view part = path.substr(start, slash - start);
    start = slash + 1;
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      why = "path must not contain '..'";
      return false;
    }
    if (part.size() > NAME_MAX) {
      why = "a part of the path is longer than " + std::to_string(NAME_MAX) + " bytes";
      return false;
    }
    if (parts.size() == kMaxDepth) {
      why = "path has more than " + std::to_string(kMaxDepth) + " parts";
      return false;
    }
    parts.emplace_back(part);
  }
  if (parts.empty()) {
    why = "path names the workspace itself, not a file in it";
    return false;
  }
  return true;
}

bool Workspace::open(const std::string& root, std::string& why, Resolver resolver) {
  resolver_ = resolver;
  root_ = Fd(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root_) why = "cannot open the workspace " + root + ": " + errno_text(errno);
  return static_cast<bool>(root_);
}

Fd Workspace::open_directory(const std::vector<std::string>& parts, std::size_t count, std::vector<Made>* made,
                             std::string& why) const {
  if (count == 0) return Fd(::fcntl(root_.get(), F_DUPFD_CLOEXEC, 0));
  if (resolver_ == Resolver::automatic && g_openat2.load(std::memory_order_relaxed) >= 0) {
    Fd dir(openat2_beneath(root_.get(), join(parts, count), O_PATH | O_DIRECTORY));
    if (dir) return dir;
    if (errno == ELOOP) {
      why = "a symbolic link is in the way (links are not followed in the workspace)";
      return Fd();
    }
    if (errno == ENOTDIR) {
      why = "a part of it is not a directory";
      return Fd();
    }
    if (errno != ENOSYS && !(errno == ENOENT && made != nullptr)) {
      why = errno_text(errno);
      return Fd();
    }
    // No openat2 here, or folders to make: the walk does both.
  }
  Fd dir(::fcntl(root_.get(), F_DUPFD_CLOEXEC, 0));
  for (std::size_t i = 0; i < count; ++i) {
    const std::string& name = parts[i];
    Fd next(::openat(dir.get(), name.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!next && errno == ENOENT && made != nullptr) {
      if (::mkdirat(dir.get(), name.c_str(), 0755) == 0) {
        made->push_back(Made{Fd(::fcntl(dir.get(), F_DUPFD_CLOEXEC, 0)), name});
      } else if (errno != EEXIST) {
        why = errno_text(errno);
        return Fd();
      }
      // Opened again the same way: a folder swapped for a link meanwhile is refused.
      next = Fd(::openat(dir.get(), name.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    }
    if (!next) {
      why = explain(dir.get(), name, errno, "a directory");
      return Fd();
    }
    dir = std::move(next);
  }
  return dir;
}

Fd Workspace::open_for_reading(const std::vector<std::string>& parts, std::string& why) const {
  const int flags = O_RDONLY | O_NOFOLLOW | O_NONBLOCK;  // a FIFO opens at once (and is refused)
  Fd file;
  if (resolver_ == Resolver::automatic && g_openat2.load(std::memory_order_relaxed) >= 0) {
    file = Fd(openat2_beneath(root_.get(), join(parts, parts.size()), flags));
    if (!file && errno != ENOSYS) {
      if (errno == ELOOP)
        why = "a symbolic link is in the way (links are not followed in the workspace)";
      else if (errno == ENOTDIR)
        why = "a part of it is not a directory";
      else
        why = errno_text(errno);
      return Fd();
    }
  }
  if (!file) {
    Fd dir = open_directory(parts, parts.size() - 1, nullptr, why);
    if (!dir) return Fd();
    file = Fd(::openat(dir.get(), parts.back().c_str(), flags | O_CLOEXEC));
    if (!file) {
      why = explain(dir.get(), parts.back(), errno, "a regular file");
      return Fd();
    }
  }
  if (!acceptable(file.get(), why)) return Fd();
  return file;
}

bool Workspace::write(const std::vector<std::string>& parts, std::string_view content, bool append,
                      std::string& why) const {
  std::vector<Made> made;
  auto fail = [&](const std::string& reason) {
    if (&reason != &why) why = reason;
    for (auto it = made.rbegin(); it != made.rend(); ++it) ::unlinkat(it->parent.get(), it->name.c_str(), AT_REMOVEDIR);
    return false;
  };
  Fd dir = open_directory(parts, parts.size() - 1, &made, why);
  if (!dir) return fail(why);
  const std::string& leaf = parts.back();
  // O_NONBLOCK: a FIFO without a reader fails at once (ENXIO) instead of holding the caller.
  const int flags = O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | (append ? O_APPEND : 0);
  bool created = true;
  Fd file(::openat(dir.get(), leaf.c_str(), flags | O_CREAT | O_EXCL, 0644));
  if (!file && errno == EEXIST) {
    created = false;
    file = Fd(::openat(dir.get(), leaf.c_str(), flags));
  }
  if (!file) return fail(explain(dir.get(), leaf, errno, "a regular file"));
  auto fail_file = [&](const std::string& reason) {
    if (created) ::unlinkat(dir.get(), leaf.c_str(), 0);
    return fail(reason);
  };
  std::string bad;
  if (!acceptable(file.get(), bad)) return fail_file(bad);  // before anything is truncated
  if (!append && !created && ::ftruncate(file.get(), 0) != 0) return fail_file("cannot truncate: " + errno_text(errno));
  if (!write_all(file.get(), content)) return fail_file("write failed: " + errno_text(errno));
  if (::close(file.release()) != 0) return fail_file("write failed: " + errno_text(errno));
  return true;
}

bool Workspace::remove(const std::vector<std::string>& parts, std::string& why) const {
  Fd dir = open_directory(parts, parts.size() - 1, nullptr, why);
  if (!dir) return false;
  const std::string& leaf = parts.back();
  struct stat st{};
  if (::fstatat(dir.get(), leaf.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    why = errno_text(errno);
    return false;
  }
  if (S_ISDIR(st.st_mode)) {
    why = "it is a directory (only files are deleted)";
    return false;
  }
  if (!S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) {
    why = "not a regular file";
    return false;
  }
  if (::unlinkat(dir.get(), leaf.c_str(), 0) != 0) {
    why = errno_text(errno);
    return false;
  }
  return true;
}

}  // namespace machina::workspace
