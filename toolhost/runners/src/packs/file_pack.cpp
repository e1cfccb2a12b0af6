// The file tools: read, write, delete, list, beneath the policy's roots only. A path is
// first checked as text (no NUL, no `..`, an absolute path must lie in a root, no part
// may match a deny glob), then opened beneath its root's descriptor following no link
// (workspace.hpp), so that nothing swapped in between check and use leads outside.
#include "packs.hpp"

#include <machina/workspace.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>

namespace machina::packs {
namespace {

using json = nlohmann::json;
using workspace::Fd;

std::string joined(const std::vector<std::string>& parts, std::size_t count) {
  std::string out;
  for (std::size_t i = 0; i < count; ++i) out += (i ? "/" : "") + parts[i];
  return out;
}

/// The deny glob a path beneath its root matches, or null. Case is ignored: on a
/// case-insensitive mount `.GIT/config` opens `.git/config`.
const std::string* denied_by(const Policy& policy, const std::vector<std::string>& parts) {
  for (const auto& glob : policy.files.deny) {
    const bool whole = glob.find('/') != std::string::npos;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      const bool hit =
          whole ? ::fnmatch(glob.c_str(), joined(parts, i + 1).c_str(), FNM_PATHNAME | FNM_PERIOD | FNM_CASEFOLD) == 0
                : ::fnmatch(glob.c_str(), parts[i].c_str(), FNM_CASEFOLD) == 0;
      if (hit) return &glob;
    }
  }
  return nullptr;
}

}  // namespace

bool resolve_path(const Call& c, const std::string& path, bool root_ok, Target& t, Result& refusal) {
  std::string why;
  const std::vector<std::string>* roots = c.policy.roots_for(c.user, why);
  if (roots == nullptr) {
    refusal = denied(why);
    return false;
  }
  if (path.empty()) {
    refusal = invalid("path must not be empty");
    return false;
  }
  if (path.find('\0') != std::string::npos) {
    refusal = invalid("path must not contain a NUL character");
    return false;
  }
  std::string rest = path;
  t.root = &roots->front();
  if (path.front() == '/') {
    t.root = nullptr;
    for (const auto& root : *roots) {
      if (path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                           (root == "/" || path[root.size()] == '/'))) {
        t.root = &root;
        rest = path.substr(root.size());
        break;
      }
    }
    if (t.root == nullptr) {
      refusal = denied(excerpt(path) + " is outside the allowed directories");
      return false;
    }
    while (!rest.empty() && rest.front() == '/') rest.erase(0, 1);
    if (rest.empty()) rest = ".";
  }
  if (!workspace::split(rest, t.parts, why)) {
    if (why.find("names the workspace itself") != std::string::npos && root_ok) {
      t.parts.clear();
      return true;
    }
    if (why.find("'..'") != std::string::npos) {
      refusal = denied(excerpt(path) + ": '..' is not allowed in a path");
    } else if (why.find("names the workspace itself") != std::string::npos) {
      refusal = invalid(excerpt(path) + " names a directory the tools work in, not a file in it");
    } else {
      refusal = invalid(excerpt(path) + ": " + why);
    }
    return false;
  }
  if (const std::string* glob = denied_by(c.policy, t.parts)) {
    refusal = denied(excerpt(path) + " is not allowed (it matches the deny pattern '" + *glob + "')");
    return false;
  }
  return true;
}

bool denied_by_name(const Policy& policy, const std::vector<std::string>& parts) {
  return denied_by(policy, parts) != nullptr;
}

Result open_failed(const std::string& path, const std::string& why) {
  const std::string text = excerpt(path) + ": " + why;
  if (why == std::strerror(ENOENT) || why == "a part of it is not a directory") return missing(text);
  if (why.find("symbolic link") != std::string::npos || why.find("not a regular file") != std::string::npos ||
      why.find("hard link") != std::string::npos || why == std::strerror(EACCES) || why == std::strerror(EPERM) ||
      why == std::strerror(ENXIO)) {
    return denied(text);
  }
  if (why.find("directory") != std::string::npos) return invalid(text);
  return system_error(text);
}

namespace {

bool open_root(const Target& t, workspace::Workspace& ws, std::string& why) {
  return ws.open(*t.root, why);
}

std::string string_field(const json& in, const char* name) {
  auto it = in.find(name);
  return it != in.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

std::string excerpt(std::string_view path) {
  std::string out;
  for (char ch : path.substr(0, 200)) out.push_back(ch == '\0' ? '?' : ch);
  return out + (path.size() > 200 ? "..." : "");
}

Result file_read(const Call& c) {
  const std::string path = string_field(c.input, "path");
  Target t;
  Result refusal;
  if (!resolve_path(c, path, false, t, refusal)) return refusal;
  const std::uint64_t limit = c.policy.files.max_read_bytes;
  std::uint64_t want = limit;
  if (auto it = c.input.find("max_bytes"); it != c.input.end()) {
    want = it->get<std::uint64_t>();
    if (want > limit) {
      return invalid("max_bytes " + std::to_string(want) + " is over the read limit of " + std::to_string(limit) +
                     " bytes");
    }
  } else if (c.shape == Shape::detailed) {
    want = std::min<std::uint64_t>(65536, limit);
  }
  workspace::Workspace ws;
  std::string why;
  Fd fd;
  if (open_root(t, ws, why)) fd = ws.open_for_reading(t.parts, why);
  if (!fd) return open_failed(path, why);
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0) return system_error(excerpt(path) + ": " + std::strerror(errno));
  if (c.policy.is_protected(st.st_dev, st.st_ino)) return denied(excerpt(path) + " is protected (the lease key)");
  if (c.shape == Shape::service && static_cast<std::uint64_t>(st.st_size) > limit) {
    return invalid(excerpt(path) + " is " + std::to_string(st.st_size) + " bytes, over the read limit of " +
                   std::to_string(limit) + " bytes");
  }
  std::string content(want + 1, '\0');
  std::size_t got = 0;
  while (got < content.size()) {
    const ssize_t n = ::read(fd.get(), content.data() + got, content.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return system_error(excerpt(path) + ": read failed: " + std::strerror(errno));
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  const bool truncated = got > want;
  content.resize(std::min<std::size_t>(got, want));
  if (c.shape == Shape::service && truncated) {
    return invalid(excerpt(path) + " grew past the read limit of " + std::to_string(limit) + " bytes while read");
  }
  json out = c.shape == Shape::service ? json(content)
                                       : json{{"path", path},
                                              {"content", content},
                                              {"truncated", truncated},
                                              {"size", static_cast<std::uint64_t>(st.st_size)}};
  try {
    (void)out.dump();
  } catch (const json::type_error&) {
    return invalid(excerpt(path) + " is not UTF-8 text");
  }
  return Result::ok(std::move(out));
}

Result file_write(const Call& c) {
  const std::string path = string_field(c.input, "path");
  const auto& content = c.input.at("content").get_ref<const std::string&>();
  const bool append = c.input.value("append", false);
  Target t;
  Result refusal;
  if (!resolve_path(c, path, false, t, refusal)) return refusal;
  if (content.size() > c.policy.files.max_write_bytes) {
    return invalid("content is " + std::to_string(content.size()) + " bytes, over the write limit of " +
                   std::to_string(c.policy.files.max_write_bytes) + " bytes");
  }
  workspace::Workspace ws;
  std::string why;
  if (!open_root(t, ws, why)) return system_error(why);
  if (!c.policy.protected_files.empty()) {
    std::string ignored;
    if (Fd existing = ws.open_for_reading(t.parts, ignored)) {
      struct stat st{};
      if (::fstat(existing.get(), &st) == 0 && c.policy.is_protected(st.st_dev, st.st_ino)) {
        return denied(excerpt(path) + " is protected (the lease key)");
      }
    }
  }
  if (!ws.write(t.parts, content, append, why)) return open_failed(path, why);
  if (c.shape == Shape::service) return Result::ok({{"bytes_written", content.size()}});
  return Result::ok({{"path", path}, {"bytes_written", content.size()}, {"append", append}});
}

Result file_delete(const Call& c) {
  const std::string path = string_field(c.input, "path");
  Target t;
  Result refusal;
  if (!resolve_path(c, path, false, t, refusal)) return refusal;
  workspace::Workspace ws;
  std::string why;
  if (!open_root(t, ws, why)) return system_error(why);
  if (!c.policy.protected_files.empty()) {
    if (Fd existing = ws.open_for_reading(t.parts, why)) {
      struct stat st{};
      if (::fstat(existing.get(), &st) == 0 && c.policy.is_protected(st.st_dev, st.st_ino)) {
        return denied(excerpt(path) + " is protected (the lease key)");
      }
    }
  }
  if (!ws.remove(t.parts, why)) return open_failed(path, why);
  if (c.shape == Shape::service) return Result::ok({{"deleted", true}});
  return Result::ok({{"path", path}, {"deleted", true}});
}

namespace {

/// Calls `on(name)` for each entry of the folder `dir` but "." and "..", in the order the
/// file system gives, until it returns false. False if the folder cannot be read.
template <class OnName>
bool each_name(int dir, OnName&& on) {
  const int fd = ::openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    ::close(fd);
    return false;
  }
  while (const dirent* e = ::readdir(d)) {
    const std::string_view name = e->d_name;
    if (name != "." && name != ".." && !on(name)) break;
  }
  ::closedir(d);
  return true;
}

}  // namespace

bool names_in(int dir, std::vector<std::string>& names) {
  names.clear();
  return each_name(dir, [&](std::string_view name) {
    names.emplace_back(name);
    return true;
  });
}

namespace {

struct Lister {
  const Call& c;
  const std::string& shown;    // the caller's path, as entries start
  const std::string& pattern;  // "" for every name
  bool recursive;
  std::vector<std::string> parts;  // beneath the root, of the directory being read
  json entries = json::array();
  bool truncated = false;

  void walk(int dir_fd, std::size_t depth) {
    std::vector<std::string> names;
    if (!names_in(dir_fd, names)) return;
    std::sort(names.begin(), names.end());
    for (const auto& name : names) {
      if (truncated) break;
      parts.push_back(name);
      if (denied_by(c.policy, parts) != nullptr) {
        parts.pop_back();
        continue;
      }
      struct stat st{};
      if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
          !c.policy.is_protected(st.st_dev, st.st_ino)) {
        const char* type = S_ISREG(st.st_mode)   ? "file"
                           : S_ISDIR(st.st_mode) ? "directory"
                           : S_ISLNK(st.st_mode) ? "symlink"
                                                 : "other";
        if (pattern.empty() || ::fnmatch(pattern.c_str(), name.c_str(), 0) == 0) {
          if (entries.size() >= c.policy.files.max_list_entries) {
            truncated = true;
            parts.pop_back();
            break;
          }
          std::string rel;
          for (std::size_t i = base; i < parts.size(); ++i) rel += (i > base ? "/" : "") + parts[i];
          std::string p = shown.empty() || shown == "." ? rel : shown + (shown.back() == '/' ? "" : "/") + rel;
          entries.push_back({{"path", std::move(p)}, {"size", static_cast<std::uint64_t>(st.st_size)}, {"type", type}});
        }
        if (recursive && S_ISDIR(st.st_mode)) {
          if (depth + 1 >= c.policy.files.max_list_depth) {
            truncated = true;
          } else {
            const int sub = ::openat(dir_fd, name.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub >= 0) {
              walk(sub, depth + 1);
              ::close(sub);
            }
          }
        }
      }
      parts.pop_back();
    }
  }
  std::size_t base = 0;  // parts[0..base) are the listed directory's own
};

}  // namespace

namespace {

bool scan(const Policy& policy, int dir_fd, const std::string& root, std::vector<std::string>& parts,
          std::uint64_t& budget, std::vector<std::string>& found) {
  bool ok = true;  // (a folder that cannot be read is passed over)
  each_name(dir_fd, [&](std::string_view entry) {
    if (budget == 0) return ok = false;
    --budget;
    parts.emplace_back(entry);
    const std::string& name = parts.back();
    if (denied_by(policy, parts) != nullptr) {
      found.push_back(root + "/" + joined(parts, parts.size()));
    } else if (parts.size() < 256) {
      struct stat st{};
      if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) {
        const int sub = ::openat(dir_fd, name.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub >= 0) {
          ok = scan(policy, sub, root, parts, budget, found);
          ::close(sub);
        }
      }
    }
    parts.pop_back();
    return ok;
  });
  return ok;
}

}  // namespace

bool denied_beneath(const Policy& policy, const std::string& root, std::uint64_t cap, std::vector<std::string>& found) {
  const int fd = ::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return true;
  std::vector<std::string> parts;
  std::uint64_t budget = cap;
  const bool ok = scan(policy, fd, root == "/" ? "" : root, parts, budget, found);
  ::close(fd);
  return ok;
}

Result file_list(const Call& c) {
  std::string path = string_field(c.input, "path");
  if (path.empty()) path = ".";
  const std::string pattern = string_field(c.input, "pattern");
  const bool recursive = c.input.value("recursive", false);
  Target t;
  Result refusal;
  if (!resolve_path(c, path, true, t, refusal)) return refusal;
  workspace::Workspace ws;
  std::string why;
  if (!open_root(t, ws, why)) return system_error(why);
  Fd dir = ws.open_dir(t.parts, why);
  if (!dir) return open_failed(path, why);
  Lister lister{c, path, pattern, recursive, t.parts, nlohmann::json::array(), false, t.parts.size()};
  lister.walk(dir.get(), 0);
  for (auto& e : lister.entries) {
    if (e["path"].get_ref<const std::string&>().empty()) e["path"] = ".";
  }
  try {
    (void)lister.entries.dump();
  } catch (const json::type_error&) {
    // A name that is not UTF-8: shown with replacement characters.
    lister.entries = json::parse(lister.entries.dump(-1, ' ', false, json::error_handler_t::replace));
  }
  if (c.shape == Shape::service) return Result::ok(std::move(lister.entries));
  return Result::ok({{"path", path}, {"entries", std::move(lister.entries)}, {"truncated", lister.truncated}});
}

}  // namespace machina::packs
