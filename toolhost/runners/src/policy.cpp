// See policy.hpp.
#include <machina/policy.hpp>

#include "toml_reader.hpp"

#include <machina/errors.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

namespace machina {
namespace {

using toml_reader::Refuser;
using toml_reader::TableReader;

constexpr std::size_t kMaxPolicyBytes = 1u << 20;

std::string absolute_from(const std::string& p, const std::string& base) {
  std::filesystem::path path(p);
  if (path.is_relative()) path = std::filesystem::path(base) / path;
  return path.lexically_normal().string();
}

/// A root as the file tools use it: absolute, normal, an existing directory (its real path,
/// so that a prefix test on what callers give cannot be fooled by a link in the root's own
/// path), without a trailing slash.
std::string root_dir(TableReader& r, const std::string& field, const std::string& p, const std::string& base) {
  std::error_code ec;
  const std::string abs = absolute_from(p, base);
  const auto real = std::filesystem::canonical(abs, ec);
  if (ec || !std::filesystem::is_directory(real, ec)) r.fail(field, "'" + p + "' is not a directory");
  std::string s = real.string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

std::vector<std::string> roots(TableReader& r, const std::string& field, const std::string& base) {
  std::vector<std::string> out;
  for (const auto& p : r.strings(field)) out.push_back(root_dir(r, field, p, base));
  return out;
}

/// A directory as real as it can be made before it exists (its existing part resolved).
std::string real_dir(const std::string& p) {
  std::error_code ec;
  std::string s = std::filesystem::weakly_canonical(p, ec).string();
  if (ec) s = std::filesystem::path(p).lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

/// The default index_dir, and why code.search may not use it when it overlaps a root.
void default_index(Policy& policy) {
  policy.code.index_dir = real_dir(default_index_dir());
  policy.code.index_dir_conflict.clear();
  const std::string root = root_overlapping(policy, policy.code.index_dir);
  if (!root.empty()) {
    policy.code.index_dir_conflict.append("the default index_dir ")
        .append(policy.code.index_dir)
        .append(" overlaps the root ")
        .append(root)
        .append(
            " (a file tool could reach the index): set [code] index_dir in the policy to a folder outside "
            "every root");
  }
}

void protect(Policy& policy, const char* path) {
  struct stat st{};
  if (path != nullptr && *path != '\0' && ::stat(path, &st) == 0)
    policy.protected_files.emplace_back(st.st_dev, st.st_ino);
}

void check_command_names(TableReader& r, const std::string& field, const std::vector<std::string>& names) {
  for (const auto& n : names) {
    if (n.empty() || (n.find('/') != std::string::npos && n.front() != '/'))
      r.fail(field, "'" + n + "' is neither a command name nor an absolute path");
  }
}

RateLimit rate(TableReader& r, const std::string& field, const toml::node& n) {
  RateLimit limit;
  if (const auto* s = n.as_string()) {
    // "N/s", "N/min", "N/h"
    const std::string text = s->get();
    const auto slash = text.find('/');
    char* end = nullptr;
    limit.calls = slash == std::string::npos ? -1 : std::strtod(text.c_str(), &end);
    const std::string unit = slash == std::string::npos ? "" : text.substr(slash + 1);
    if (slash == std::string::npos || end != text.c_str() + slash || !(limit.calls > 0)) {
      r.fail(field, "must be like \"10/s\", \"100/min\" or \"1000/h\"");
    }
    if (unit == "s")
      limit.per_seconds = 1;
    else if (unit == "min")
      limit.per_seconds = 60;
    else if (unit == "h")
      limit.per_seconds = 3600;
    else
      r.fail(field, "must be like \"10/s\", \"100/min\" or \"1000/h\" (unit s, min or h)");
    return limit;
  }
  r.fail(field, "must be a string like \"10/s\", not " + toml_reader::type_name(n));
}

}  // namespace

const std::vector<std::string>& default_deny_globs() {
  static const std::vector<std::string> globs = {
      ".env",       ".env.*", "*.pem", "*.key",  "*.p12",  "id_*",    "credentials.json", ".git/config",
      ".git/hooks", ".ssh",   ".aws",  ".gnupg", ".netrc", ".pypirc", ".npmrc",           ".docker/config.json"};
  return globs;
}

const std::vector<std::string>* Policy::roots_for(std::string_view user, std::string& why) const {
  if (user.empty()) return &files.roots;
  auto it = users.find(std::string(user));
  if (it == users.end()) {
    if (unknown_users) return &files.roots;
    why = "user '" + std::string(user.substr(0, 100)) + "' is not in the policy";
    return nullptr;
  }
  return it->second.roots.empty() ? &files.roots : &it->second.roots;
}

const std::vector<std::string>* Policy::codebases_for(std::string_view user, std::string& why) const {
  auto it = user.empty() ? users.end() : users.find(std::string(user));
  if (it != users.end()) return &it->second.codebases;
  if (!user.empty() && !unknown_users) {
    why = "user '" + std::string(user.substr(0, 100)) + "' is not in the policy";
    return nullptr;
  }
  return &code.default_codebases;
}

std::string default_index_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && xdg[0] == '/') return (std::filesystem::path(xdg) / "machina-toolhost" / "code-index").string();
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] == '/' && home[1] != '\0') {
    return (std::filesystem::path(home) / ".cache" / "machina-toolhost" / "code-index").string();
  }
  std::string dir = "/tmp/machina-toolhost-";
  dir.append(std::to_string(::geteuid())).append("/code-index");
  return dir;
}

std::string root_overlapping(const Policy& policy, const std::string& dir) {
  auto inside = [](const std::string& a, const std::string& b) {  // a is b or lies beneath it
    return a == b || b == "/" || (a.size() > b.size() && a.compare(0, b.size(), b) == 0 && a[b.size()] == '/');
  };
  std::vector<const std::string*> all;
  for (const auto& r : policy.files.roots) all.push_back(&r);
  for (const auto& [name, scope] : policy.users) {
    for (const auto& r : scope.roots) all.push_back(&r);
  }
  for (const auto& [id, root] : policy.codebases) all.push_back(&root);
  for (const std::string* r : all) {
    if (inside(dir, *r) || inside(*r, dir)) return *r;
  }
  return {};
}

std::string Policy::scope_of(std::string_view user) const {
  return !user.empty() && users.count(std::string(user)) != 0 ? std::string(user) : std::string();
}

bool Policy::is_protected(dev_t dev, ino_t ino) const {
  return std::find(protected_files.begin(), protected_files.end(), std::make_pair(dev, ino)) != protected_files.end();
}

Policy default_policy(const std::string& workspace) {
  Policy policy;
  std::error_code ec;
  const std::string base = std::filesystem::current_path(ec).string();
  const auto real = std::filesystem::weakly_canonical(absolute_from(workspace.empty() ? "." : workspace, base), ec);
  std::string root = real.string();
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  policy.files.roots = {root};
  protect(policy, std::getenv("MACHINA_LEASE_KEY_FILE"));
  default_index(policy);
  return policy;
}

Policy parse_policy(std::string_view text, const std::string& path, const std::string& workspace) {
  const Refuser refuse{path};
  const toml::table doc = toml_reader::parse(text, refuse);
  Policy policy = default_policy(workspace);
  policy.source = path;
  std::error_code ec;
  const std::string base = std::filesystem::absolute(std::filesystem::path(path), ec)
                               .parent_path()
                               .string();  // relative roots: the file's folder
  TableReader top(doc, refuse, "");
  std::size_t index_dir_line = 0, default_codebases_line = 0;  // where they were set (checked at the end)
  auto table = [&](const char* key) -> const toml::table* {
    const toml::node* n = top.get(key);
    if (n == nullptr) return nullptr;
    if (n->as_table() == nullptr) refuse(*n, "'" + std::string(key) + "' must be a table ([" + key + "])");
    return n->as_table();
  };
  if (const auto* t = table("files")) {
    TableReader r(*t, refuse, "[files]: ");
    if (r.has("roots")) {
      policy.files.roots = roots(r, "roots", base);
      if (policy.files.roots.empty()) r.fail("roots", "must name at least one directory");
    }
    if (r.has("deny")) policy.files.deny = r.strings("deny");
    for (const auto& g : r.strings("deny_also")) policy.files.deny.push_back(g);
    policy.files.max_read_bytes = static_cast<std::uint64_t>(
        r.integer("max_read_bytes", static_cast<std::int64_t>(policy.files.max_read_bytes), 0, 1 << 30));
    policy.files.max_write_bytes = static_cast<std::uint64_t>(
        r.integer("max_write_bytes", static_cast<std::int64_t>(policy.files.max_write_bytes), 0, 1 << 30));
    policy.files.max_list_entries = static_cast<std::uint64_t>(
        r.integer("max_list_entries", static_cast<std::int64_t>(policy.files.max_list_entries), 1, 1'000'000));
    policy.files.max_list_depth = static_cast<std::uint64_t>(
        r.integer("max_list_depth", static_cast<std::int64_t>(policy.files.max_list_depth), 1, 256));
    r.no_other_keys();
  }
  if (const auto* t = table("shell")) {
    TableReader r(*t, refuse, "[shell]: ");
    ShellPolicy& s = policy.shell;
    s.allow = r.strings("allow");
    check_command_names(r, "allow", s.allow);
    if (r.has("deny")) s.deny = r.strings("deny");
    check_command_names(r, "deny", s.deny);
    s.timeout_ms = r.integer("timeout_ms", s.timeout_ms, 1, 24LL * 3600 * 1000);
    s.memory_mb =
        static_cast<std::uint64_t>(r.integer("memory_mb", static_cast<std::int64_t>(s.memory_mb), 0, 1 << 20));
    s.cpu_seconds =
        static_cast<std::uint64_t>(r.integer("cpu_seconds", static_cast<std::int64_t>(s.cpu_seconds), 0, 86'400));
    s.file_size_mb =
        static_cast<std::uint64_t>(r.integer("file_size_mb", static_cast<std::int64_t>(s.file_size_mb), 0, 1 << 20));
    s.open_files =
        static_cast<std::uint64_t>(r.integer("open_files", static_cast<std::int64_t>(s.open_files), 0, 1 << 20));
    s.network = r.boolean("network", s.network);
    s.subprocesses = r.boolean("subprocesses", s.subprocesses);
    s.max_output_bytes = static_cast<std::uint64_t>(
        r.integer("max_output_bytes", static_cast<std::int64_t>(s.max_output_bytes), 0, 256 * 1024));
    if (r.has("read_paths")) {
      s.read_paths = r.strings("read_paths");
      for (const auto& p : s.read_paths) {
        if (p.empty() || p.front() != '/') r.fail("read_paths", "'" + p + "' is not an absolute path");
      }
    }
    s.max_scanned_entries = static_cast<std::uint64_t>(
        r.integer("max_scanned_entries", static_cast<std::int64_t>(s.max_scanned_entries), 1, 10'000'000));
    if (r.has("path")) {
      s.path = r.strings("path");
      for (const auto& p : s.path) {
        if (p.empty() || p.front() != '/') r.fail("path", "'" + p + "' is not an absolute directory");
      }
    }
    r.no_other_keys();
  }
  if (const auto* t = table("code")) {
    TableReader r(*t, refuse, "[code]: ");
    CodePolicy& c = policy.code;
    c.rg = r.string("rg", false);
    if (!c.rg.empty() && c.rg.front() != '/') r.fail("rg", "must be an absolute path");
    c.max_results =
        static_cast<std::uint64_t>(r.integer("max_results", static_cast<std::int64_t>(c.max_results), 1, 10'000));
    c.max_file_bytes = static_cast<std::uint64_t>(
        r.integer("max_file_bytes", static_cast<std::int64_t>(c.max_file_bytes), 1, std::int64_t{1} << 32));
    if (r.has("index_dir")) {
      const std::string dir = r.string("index_dir", true);
      if (dir.empty()) r.fail("index_dir", "must name a directory");
      c.index_dir = real_dir(absolute_from(dir, base));
      index_dir_line = r.get("index_dir")->source().begin.line;
    }
    c.max_index_files = static_cast<std::uint64_t>(
        r.integer("max_index_files", static_cast<std::int64_t>(c.max_index_files), 1, 1'000'000));
    c.max_index_bytes = static_cast<std::uint64_t>(
        r.integer("max_index_bytes", static_cast<std::int64_t>(c.max_index_bytes), 1, std::int64_t{1} << 40));
    c.max_refresh_bytes = static_cast<std::uint64_t>(
        r.integer("max_refresh_bytes", static_cast<std::int64_t>(c.max_refresh_bytes), 1, std::int64_t{1} << 40));
    c.default_codebases = r.strings("default_codebases");
    if (r.has("default_codebases")) default_codebases_line = r.get("default_codebases")->source().begin.line;
    r.no_other_keys();
  }
  if (const auto* t = table("python")) {
    TableReader r(*t, refuse, "[python]: ");
    PythonPolicy& p = policy.python;
    auto count = [&](const char* field, std::uint64_t& value, std::int64_t low, std::int64_t high) {
      value = static_cast<std::uint64_t>(r.integer(field, static_cast<std::int64_t>(value), low, high));
    };
    auto absolute_paths = [&](const char* field, const std::vector<std::string>& paths) {
      for (const auto& entry : paths) {
        if (entry.empty() || entry.front() != '/') r.fail(field, "'" + entry + "' is not an absolute path");
      }
    };
    p.python = r.string("python", false, p.python);
    if (p.python.empty()) r.fail("python", "must name an interpreter");
    if (p.python.find('/') != std::string::npos) p.python = absolute_from(p.python, base);
    if (r.has("workspaces")) {
      p.workspaces = r.string("workspaces", true);
      if (p.workspaces.empty()) r.fail("workspaces", "must name a directory");
      p.workspaces = absolute_from(p.workspaces, base);
    }
    p.timeout_ms = r.integer("timeout_ms", p.timeout_ms, 1, 24LL * 3600 * 1000);
    count("cpu_seconds", p.cpu_seconds, 0, 86'400);
    count("memory_mb", p.memory_mb, 0, 1 << 20);
    count("file_size_mb", p.file_size_mb, 0, 1 << 20);
    count("folder_quota_mb", p.folder_quota_mb, 0, 1 << 20);
    count("open_files", p.open_files, 0, 1 << 20);
    count("max_code_bytes", p.max_code_bytes, 1, 4 << 20);
    count("max_output_bytes", p.max_output_bytes, 0, 256 * 1024);
    count("max_result_bytes", p.max_result_bytes, 64, 256 * 1024);
    count("workers", p.workers, 1, 64);
    count("max_sessions", p.max_sessions, 0, 1024);
    p.session_idle_ms = r.integer("session_idle_ms", p.session_idle_ms, 1, 7LL * 24 * 3600 * 1000);
    if (r.has("read_paths")) {
      p.read_paths = r.strings("read_paths");
      absolute_paths("read_paths", p.read_paths);
    }
    if (r.has("allow")) p.allow = r.strings("allow");
    p.deny = r.strings("deny");
    for (const auto& [field, names] : {std::pair{"allow", &p.allow}, std::pair{"deny", &p.deny}}) {
      for (const auto& name : *names) {
        if (name.empty()) r.fail(field, "a package name (or glob) must not be empty");
      }
    }
    p.index_url = r.string("index_url", false);
    if (!p.index_url.empty() && p.index_url.rfind("https://", 0) != 0 && p.index_url.rfind("http://", 0) != 0) {
      r.fail("index_url", "must be an http:// or https:// URL");
    }
    p.find_links = r.strings("find_links");
    for (auto& link : p.find_links) {
      if (link.rfind("https://", 0) == 0 || link.rfind("http://", 0) == 0) continue;
      if (link.empty() || link.find("://") != std::string::npos) {
        r.fail("find_links", "'" + link + "' is neither a folder nor an http(s) URL");
      }
      link = absolute_from(link, base);
    }
    p.no_index = r.boolean("no_index", p.no_index);
    p.allow_urls = r.boolean("allow_urls", p.allow_urls);
    p.only_binary = r.boolean("only_binary", p.only_binary);
    p.install_timeout_ms = r.integer("install_timeout_ms", p.install_timeout_ms, 1, 24LL * 3600 * 1000);
    count("max_install_packages", p.max_install_packages, 0, 256);
    count("sync_max_files", p.sync_max_files, 0, 10'000'000);
    count("sync_max_bytes", p.sync_max_bytes, 0, std::int64_t{1} << 40);
    r.no_other_keys();
  }
  if (const auto* t = table("rate_limits")) {
    TableReader r(*t, refuse, "[rate_limits]: ");
    for (const auto& [k, v] : *t) {
      const std::string name(k.str());
      r.get(name);
      policy.rate_limits[name] = rate(r, name, v);
    }
  }
  if (const auto* t = table("codebases")) {
    TableReader r(*t, refuse, "[codebases]: ");
    for (const auto& [k, v] : *t) {
      const std::string id(k.str());
      const auto* s = v.as_string();
      r.get(id);
      if (s == nullptr) r.fail(id, "must be a directory's path, not " + toml_reader::type_name(v));
      policy.codebases[id] = root_dir(r, id, s->get(), base);
    }
  }
  if (const auto* t = table("users")) {
    for (const auto& [k, v] : *t) {
      const std::string name(k.str());
      if (v.as_table() == nullptr) refuse(v, "[users]: '" + name + "' must be a table ([users." + name + "])");
      TableReader r(*v.as_table(), refuse, "[users." + name + "]: ");
      UserScope scope;
      scope.roots = roots(r, "roots", base);
      scope.codebases = r.strings("codebases");
      for (const auto& id : scope.codebases) {
        if (policy.codebases.count(id) == 0) r.fail("codebases", "'" + id + "' is not in [codebases]");
      }
      r.no_other_keys();
      policy.users[name] = std::move(scope);
    }
  }
  for (const auto& id : policy.code.default_codebases) {
    if (policy.codebases.count(id) == 0) {
      refuse(default_codebases_line, "[code]: field 'default_codebases': '" + id + "' is not in [codebases]");
    }
  }
  // code.search's indexes hold what the roots hold: no tool may reach them through a root.
  if (index_dir_line != 0) {
    policy.code.index_dir_conflict.clear();  // (what the defaults said of the default folder)
    const std::string root = root_overlapping(policy, policy.code.index_dir);
    if (!root.empty()) {
      refuse(index_dir_line, "[code]: field 'index_dir': '" + policy.code.index_dir + "' overlaps the root '" + root +
                                 "' (the index must lie outside every root, codebase and user root)");
    }
  } else {
    default_index(policy);
  }
  policy.unknown_users = top.boolean("unknown_users", true);
  top.no_other_keys();
  return policy;
}

Policy load_policy(const std::string& path, const std::string& workspace) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("cannot read policy file " + path);
  std::string text;
  text.resize(kMaxPolicyBytes + 1);
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > kMaxPolicyBytes) throw ConfigError("policy file " + path + " is larger than 1 MiB");
  return parse_policy(text, path, workspace);
}

Policy policy_from_env() {
  const char* ws = std::getenv("MACHINA_TOOLHOST_WORKSPACE");
  const std::string workspace = ws != nullptr ? ws : "";
  const char* file = std::getenv("MACHINA_TOOLHOST_POLICY");
  return file != nullptr && *file != '\0' ? load_policy(file, workspace) : default_policy(workspace);
}

}  // namespace machina
