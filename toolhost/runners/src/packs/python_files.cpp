// See python_files.hpp.
#include "python_files.hpp"

#include "packs.hpp"

#include <machina/fd_io.hpp>
#include <machina/workspace.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace machina::packs::python_files {
namespace {

using workspace::Fd;

constexpr int kMaxOpenDepth = 48;  // folders held open at once while removing
constexpr int kMaxRemovePasses = 10'000;

std::string error_text(const std::string& what) {
  return what + ": " + std::strerror(errno);
}

/// Opens the folder `name` in `dir` following no link; one the code made unreadable is
/// made readable again first (it is ours: the sandbox maps the code to our user).
Fd open_subdir(int dir, const std::string& name) {
  int fd = ::openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0 && errno == EACCES && ::fchmodat(dir, name.c_str(), 0700, 0) == 0) {
    fd = ::openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  }
  return Fd(fd);
}

/// Empties the open folder `dir`; folders deeper than kMaxOpenDepth are moved into `top`
/// (then `hoisted` is set, and the caller empties `top` again).
bool clear(int dir, int top, int depth, std::uint64_t& serial, bool& hoisted, std::string& why) {
  std::vector<std::string> names;
  if (!names_in(dir, names)) {
    why = error_text("cannot read a folder to remove");
    return false;
  }
  for (const auto& name : names) {
    if (::unlinkat(dir, name.c_str(), 0) == 0 || errno == ENOENT) continue;
    if (errno != EISDIR && errno != EPERM) {
      why = error_text("cannot remove " + name);
      return false;
    }
    if (depth >= kMaxOpenDepth) {
      const std::string moved = ".removing-" + std::to_string(++serial);
      if (::renameat(dir, name.c_str(), top, moved.c_str()) != 0) {
        why = error_text("cannot move " + name + " up to remove it");
        return false;
      }
      hoisted = true;
      continue;
    }
    Fd sub = open_subdir(dir, name);
    if (!sub) {
      if (errno == ENOENT) continue;
      why = error_text("cannot open " + name + " to remove it");
      return false;
    }
    if (!clear(sub.get(), top, depth + 1, serial, hoisted, why)) return false;
    if (::unlinkat(dir, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
      if (errno == ENOTEMPTY) {  // something was written into it meanwhile: the next pass
        hoisted = true;
        continue;
      }
      why = error_text("cannot remove " + name);
      return false;
    }
  }
  return true;
}

/// Empties the open folder `top`, in passes while folders too deep were moved up into it.
bool clear_all(int top, std::string& why) {
  std::uint64_t serial = 0;
  for (int pass = 0; pass < kMaxRemovePasses; ++pass) {
    bool again = false;
    if (!clear(top, top, 1, serial, again, why)) return false;
    if (!again) return true;
  }
  why = "something kept being written into the folder being removed";
  return false;
}

/// Removes the entry `name` of the open folder `parent`, whatever it is.
bool remove_at(int parent, const std::string& name, std::string& why) {
  if (::unlinkat(parent, name.c_str(), 0) == 0 || errno == ENOENT) return true;
  if (errno != EISDIR && errno != EPERM) {
    why = error_text("cannot remove " + name);
    return false;
  }
  Fd top = open_subdir(parent, name);
  if (!top) {
    if (errno == ENOENT) return true;
    why = error_text("cannot open " + name + " to remove it");
    return false;
  }
  if (!clear_all(top.get(), why)) return false;
  if (::unlinkat(parent, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
    why = error_text("cannot remove " + name);
    return false;
  }
  return true;
}

/// The folder above `path` and the last name in it.
bool split_last(const std::string& path, std::string& parent, std::string& name) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const auto slash = p.rfind('/');
  if (slash == std::string::npos || slash + 1 >= p.size()) return false;
  parent = slash == 0 ? "/" : p.substr(0, slash);
  name = p.substr(slash + 1);
  return name != "." && name != "..";
}

/// Makes the folder `name` in `dst` (what is there by that name and is not a folder is
/// removed first); opened following no link.
Fd dest_dir(int dst, const std::string& name, std::string& why) {
  if (::mkdirat(dst, name.c_str(), 0700) != 0 && errno != EEXIST) {
    why = error_text("cannot make " + name);
    return Fd();
  }
  struct stat st{};
  if (::fstatat(dst, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(st.st_mode)) {
    if (!remove_at(dst, name, why)) return Fd();
    if (::mkdirat(dst, name.c_str(), 0700) != 0) {
      why = error_text("cannot make " + name);
      return Fd();
    }
  }
  Fd fd(::openat(dst, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) why = error_text("cannot open " + name);
  return fd;
}

/// Copies at most `budget` bytes of the open file `in` into a new file `name` in `dst`
/// (what was there by that name removed first).
bool copy_file(int in, int dst, const std::string& name, mode_t mode, std::uint64_t budget, std::uint64_t& copied,
               std::string& why) {
  if (!remove_at(dst, name, why)) return false;
  Fd out(::openat(dst, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, (mode & 0755) | 0600));
  if (!out) {
    why = error_text("cannot make " + name);
    return false;
  }
  char buf[64 * 1024];
  while (budget > 0) {
    const ssize_t n = ::read(in, buf, static_cast<std::size_t>(std::min<std::uint64_t>(sizeof buf, budget)));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      why = error_text("cannot read " + name);
      return false;
    }
    if (!write_all(out.get(), std::string_view(buf, static_cast<std::size_t>(n)))) {
      why = error_text("cannot write " + name);
      return false;
    }
    budget -= static_cast<std::uint64_t>(n);
    copied += static_cast<std::uint64_t>(n);
  }
  return true;
}

struct Copier {
  const Policy& policy;
  const std::vector<std::pair<dev_t, ino_t>>& skip;
  std::uint64_t max_files;
  std::uint64_t max_bytes;
  std::uint64_t max_depth;
  Copied& copied;
  std::string& why;
  std::vector<std::string> parts;

  /// Counts (dst < 0) or copies what is beneath `src`; false to stop.
  bool walk(int src, int dst, std::uint64_t depth, CopyEnd& end) {
    std::vector<std::string> names;
    if (!names_in(src, names)) return true;  // (unreadable: as the file tools, nothing there)
    std::sort(names.begin(), names.end());
    for (const auto& name : names) {
      parts.push_back(name);
      const bool ok = entry(src, dst, name, depth, end);
      parts.pop_back();
      if (!ok) return false;
    }
    return true;
  }

  bool entry(int src, int dst, const std::string& name, std::uint64_t depth, CopyEnd& end) {
    struct stat st{};
    if (denied_by_name(policy, parts) || ::fstatat(src, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      ++copied.skipped;
      return true;
    }
    if (S_ISDIR(st.st_mode)) {
      if (depth + 1 >= max_depth ||
          std::find(skip.begin(), skip.end(), std::make_pair(st.st_dev, st.st_ino)) != skip.end()) {
        ++copied.skipped;
        return true;
      }
      Fd sub(::openat(src, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!sub) {
        ++copied.skipped;
        return true;
      }
      Fd out;
      if (dst >= 0) {
        out = dest_dir(dst, name, why);
        if (!out) {
          end = CopyEnd::failed;
          return false;
        }
      }
      return walk(sub.get(), dst >= 0 ? out.get() : -1, depth + 1, end);
    }
    if (!S_ISREG(st.st_mode) || st.st_nlink != 1 || policy.is_protected(st.st_dev, st.st_ino)) {
      ++copied.skipped;
      return true;
    }
    const auto size = static_cast<std::uint64_t>(st.st_size);
    if (copied.files + 1 > max_files || copied.bytes + size > max_bytes) {
      end = CopyEnd::over_cap;
      return false;
    }
    if (dst < 0) {
      ++copied.files;
      copied.bytes += size;
      return true;
    }
    Fd in(::openat(src, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    struct stat again{};
    if (!in || ::fstat(in.get(), &again) != 0 || again.st_ino != st.st_ino || again.st_dev != st.st_dev ||
        !S_ISREG(again.st_mode) || again.st_nlink != 1) {
      ++copied.skipped;  // (changed since it was looked at)
      return true;
    }
    ++copied.files;
    if (!copy_file(in.get(), dst, name, st.st_mode, max_bytes - copied.bytes, copied.bytes, why)) {
      end = CopyEnd::failed;
      return false;
    }
    return true;
  }
};

}  // namespace

bool make_dirs(const std::string& path, std::string& why) {
  std::string at;
  for (std::size_t i = 0; i <= path.size(); ++i) {
    if (i < path.size() && path[i] != '/') continue;
    at = path.substr(0, i);
    if (at.empty()) continue;
    if (::mkdir(at.c_str(), 0700) != 0 && errno != EEXIST) {
      why = error_text("cannot make the folder " + at);
      return false;
    }
  }
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    why = path + " is not a folder";
    return false;
  }
  return true;
}

bool remove_tree(const std::string& path, std::string& why) {
  std::string parent, name;
  if (!split_last(path, parent, name)) {
    why = "will not remove " + path;
    return false;
  }
  Fd dir(::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir) {
    if (errno == ENOENT) return true;
    why = error_text("cannot open " + parent);
    return false;
  }
  return remove_at(dir.get(), name, why);
}

CopyEnd copy_root(const Policy& policy, const std::string& root, const std::string& dest,
                  const std::vector<std::pair<dev_t, ino_t>>& skip, std::uint64_t max_files, std::uint64_t max_bytes,
                  Copied& copied, std::string& why) {
  Fd src(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!src) {
    why = error_text("cannot open " + root);
    return CopyEnd::failed;
  }
  const std::uint64_t depth = policy.files.max_list_depth;
  CopyEnd end = CopyEnd::done;
  Copier count{policy, skip, max_files, max_bytes, depth, copied, why, {}};
  if (!count.walk(src.get(), -1, 0, end)) return end;
  copied = Copied{};
  if (!make_dirs(dest, why)) return CopyEnd::failed;
  Fd out(::open(dest.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!out) {
    why = error_text("cannot open " + dest);
    return CopyEnd::failed;
  }
  Copier copy{policy, skip, max_files, max_bytes, depth, copied, why, {}};
  copy.walk(src.get(), out.get(), 0, end);
  return end;
}

int lock_file(const std::string& path, bool wait, std::string& why) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    why = error_text("cannot open the lock " + path);
    return -1;
  }
  int rc;
  do {
    rc = ::flock(fd, LOCK_EX | (wait ? 0 : LOCK_NB));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int saved = errno;
    why = error_text("cannot lock " + path);
    ::close(fd);
    errno = saved;
    return -1;
  }
  return fd;
}

}  // namespace machina::packs::python_files
