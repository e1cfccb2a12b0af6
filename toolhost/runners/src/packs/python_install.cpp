// install_python_package, and execute_python's install_packages: each requirement is checked
// as text first (a name, extras and version specifiers; "name @ https://..." only when the
// policy allows URLs; never an option, a path or an environment marker) and against the
// policy's allow and deny lists, all before anything runs; then pip installs them one at a
// time into the workspace's virtual environment, run by the host in walls of its own: the
// network is open (the code's never is), but it reads only the interpreters' files, the
// name-service and certificate files and the policy's find_links folders, writes only the
// environment and its temporary folder, and never sees the lease key. pip (the policy's
// interpreter's) runs in the environment's interpreter without its site initialisation:
// the environment's packages are seen as installed, but none of their code runs (no .pth
// file, no sitecustomize), since pip's walls let the network through. The first failure
// stops the rest, with pip's own words.
#include "../pip_walls.hpp"
#include "python_files.hpp"
#include "python_pack.hpp"

#include <machina/child_process.hpp>
#include <machina/clock.hpp>
#include <machina/isolation/sandbox_exec.hpp>

#include <fnmatch.h>
#include <strings.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <iterator>
#include <thread>

namespace machina::packs {
namespace {

using json = nlohmann::json;

constexpr std::size_t kMaxRequirementBytes = 300;
constexpr std::size_t kMaxReportBytes = 8 << 20;

// File endings pip takes for an archive to install from (a path, not a name).
const char* const kArchiveEndings[] = {".whl", ".zip",    ".tar", ".tar.gz", ".tgz", ".tar.bz2",
                                       ".tbz", ".tar.xz", ".txz", ".tar.lz", ".tlz", ".tar.lzma"};

bool name_char(char ch) {
  return std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.';
}

/// A name as pip compares names (PEP 503): lower case, each run of '-', '_', '.' one '-'.
std::string canonical(const std::string& name) {
  std::string out;
  for (char ch : name) {
    if (ch == '-' || ch == '_' || ch == '.') {
      if (out.empty() || out.back() != '-') out.push_back('-');
    } else {
      out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(ch))));
    }
  }
  return out;
}

bool matches(const std::vector<std::string>& globs, const std::string& name) {
  for (const auto& g : globs) {
    if (::fnmatch(canonical(g).c_str(), name.c_str(), 0) == 0) return true;
  }
  return false;
}

/// Checks a requirement as text and against the lists; its canonical name, or the refusal.
bool check_requirement(const PythonPolicy& p, const std::string& text, std::string& name, Result& refusal) {
  const std::string shown = excerpt(text);
  const std::string form = "package " + shown +
                           " is not a package name with optional extras and version (like 'requests', "
                           "'numpy>=1.26' or 'pandas[excel]==2.2.2')";
  if (text.empty() || text.size() > kMaxRequirementBytes) {
    refusal = invalid("a package must be 1 to " + std::to_string(kMaxRequirementBytes) + " bytes");
    return false;
  }
  for (char ch : text) {
    const auto u = static_cast<unsigned char>(ch);
    if (u < 0x20 || u >= 0x7f) {
      refusal = invalid("package " + shown + " holds a character that is not printable ASCII");
      return false;
    }
  }
  std::size_t i = 0;
  auto spaces = [&] {
    while (i < text.size() && text[i] == ' ') ++i;
  };
  if (!std::isalnum(static_cast<unsigned char>(text[0]))) {
    refusal = invalid(form + (text[0] == '-' ? "; options cannot be given" : ""));
    return false;
  }
  while (i < text.size() && name_char(text[i])) ++i;
  if (!std::isalnum(static_cast<unsigned char>(text[i - 1]))) {
    refusal = invalid(form);
    return false;
  }
  name = canonical(text.substr(0, i));
  spaces();
  // A file name (pip reads "x.whl" or "x.tar.gz" as a path, not a name) is not a package.
  for (const char* archive : kArchiveEndings) {
    const std::size_t n = std::char_traits<char>::length(archive);
    if (i >= n && strncasecmp(text.c_str() + i - n, archive, n) == 0) {
      refusal = invalid(form + "; paths and URLs are not packages");
      return false;
    }
  }
  if (i < text.size() && text[i] == '[') {
    // Extras: names (each like a package's), separated by commas.
    ++i;
    for (;;) {
      spaces();
      const std::size_t from = i;
      while (i < text.size() && name_char(text[i])) ++i;
      if (i == from || !std::isalnum(static_cast<unsigned char>(text[from])) ||
          !std::isalnum(static_cast<unsigned char>(text[i - 1]))) {
        refusal = invalid(form + (text.find('-', from) == from ? "; options cannot be given" : ""));
        return false;
      }
      spaces();
      if (i < text.size() && text[i] == ',') {
        ++i;
        continue;
      }
      break;
    }
    if (i >= text.size() || text[i] != ']') {
      refusal = invalid(form);
      return false;
    }
    ++i;
    spaces();
  }
  if (i < text.size() && text[i] == '@') {
    ++i;
    spaces();
    if (!p.allow_urls) {
      refusal = denied("package " + shown + " names a URL, which the policy does not allow ([python] allow_urls)");
      return false;
    }
    if (text.compare(i, 8, "https://") != 0 || text.find(' ', i) != std::string::npos || text.size() - i <= 8) {
      refusal = invalid("package " + shown + ": a URL must be https:// without spaces");
      return false;
    }
    i = text.size();
  }
  while (i < text.size()) {
    static const char* const kOps[] = {"===", "~=", "==", "!=", "<=", ">=", "<", ">"};
    std::size_t op = 0;
    for (const char* candidate : kOps) {
      const std::size_t n = std::char_traits<char>::length(candidate);
      if (text.compare(i, n, candidate) == 0) {
        op = n;
        break;
      }
    }
    if (op == 0) {
      refusal = invalid(form + (text.find("://") != std::string::npos || text.find('/') != std::string::npos
                                    ? "; paths and URLs are not packages"
                                    : ""));
      return false;
    }
    i += op;
    spaces();
    const std::size_t from = i;
    while (i < text.size() && (std::isalnum(static_cast<unsigned char>(text[i])) ||
                               std::string_view(".*+!_-").find(text[i]) != std::string_view::npos))
      ++i;
    if (i == from) {
      refusal = invalid(form);
      return false;
    }
    spaces();
    if (i < text.size()) {
      if (text[i] != ',') {
        refusal = invalid(form);
        return false;
      }
      ++i;
      spaces();
    }
  }
  const std::string refused = "Package '" + excerpt(name) + "' is not allowed by security policy";
  if (matches(p.deny, name)) {
    refusal = denied(refused);
    return false;
  }
  if (!matches(p.allow, name)) {
    refusal = denied(refused + (p.allow.empty() ? " (the policy allows no install)" : ""));
    return false;
  }
  return true;
}

/// Runs pip's __pip-runner__.py in the environment's interpreter started with -I -S: the
/// environment made the interpreter's prefix and its site-packages (and the base
/// interpreter's) put on the path as site would, but no .pth file processed; the
/// environment's own folders have no import finder (None in sys.path_importer_cache), so
/// pip sees what is installed there (importlib.metadata reads the folders) and imports
/// nothing from them.
constexpr const char* kPipBoot =
    "import runpy, site, sys\n"
    "runner, env = sys.argv[1:3]\n"
    "del sys.argv[1:3]\n"
    "sys.prefix = sys.exec_prefix = env\n"
    "own = site.getsitepackages([env])\n"
    "sys.path += own + site.getsitepackages([sys.base_prefix])\n"
    "sys.path_importer_cache.update(dict.fromkeys(own))\n"
    "sys.argv[0] = runner\n"
    "runpy.run_path(runner, run_name='__main__')\n";

/// pip's __pip-runner__.py of the policy's interpreter; "" with `why`.
std::string find_pip_runner(const std::string& base_python, std::string& why) {
  ChildSpec find;
  find.executable = base_python;
  find.argv = {base_python, "-I", "-c",
               "import os, pip; print(os.path.join(os.path.dirname(pip.__file__), '__pip-runner__.py'))"};
  find.env = {"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "LC_ALL=C.UTF-8"};
  find.tail_bytes = 4096;
  ChildOutcome run;
  try {
    run = run_to_completion(find, "", std::chrono::seconds(60), 1 << 16);
  } catch (const ConfigError& e) {
    why = std::string("pip could not be looked for: ") + e.what();
    return {};
  }
  if (run.ended != ChildOutcome::Ended::exited || run.exit_code != 0) {
    why = run.tail.find("No module named pip") != std::string::npos
              ? "pip is not installed for " + base_python + " (the policy's [python] python)"
              : "pip could not be looked for: " + base_python + " " + run.how + ": " + run.tail;
    return {};
  }
  std::string path = run.stdout_text;
  while (!path.empty() && (path.back() == '\n' || path.back() == '\r')) path.pop_back();
  if (path.empty() || path.front() != '/' || ::access(path.c_str(), R_OK) != 0) {
    why = "the pip of " + base_python + " is too old: installs need pip 22.3 or later";
    return {};
  }
  return path;
}

/// How one pip run ended.
struct PipRun {
  enum class End { installed, failed, out_of_time, system } end = End::failed;
  std::string text;                // failed, system: why
  json installed = json::array();  // installed: [{name, version}] (empty: it was there already)
};

PipRun run_pip(const PythonPolicy& p, const std::string& executable, const PythonPack::Workspace& ws,
               const std::string& spec, std::int64_t limit_ms) {
  PipRun out;
  sandbox::ExecSpec walls;
  walls.restrict_read = true;
  walls.read_paths = ws.files.paths;
  try {
    const InterpreterFiles base = interpreter_files(ws.base_python);
    walls.read_paths.insert(walls.read_paths.end(), base.paths.begin(), base.paths.end());
  } catch (const ConfigError& e) {
    out.end = PipRun::End::system;
    out.text = e.what();
    return out;
  }
  for (const char* path : kInstallReadPaths) walls.read_paths.emplace_back(path);
  for (const auto& link : p.find_links) {
    if (link.front() == '/') walls.read_paths.push_back(link);
  }
  walls.restrict_write = true;
  walls.write_paths = {ws.env, ws.pip_tmp};
  if (const char* key = std::getenv("MACHINA_LEASE_KEY_FILE"); key != nullptr && *key != '\0') {
    walls.hidden_files.emplace_back(key);
  }
  ChildSpec child;
  child.executable = executable;
  child.argv = {executable, "--sandbox-exec", walls.to_json(), "--",  ws.python, "-I", "-S",
                "-c",       kPipBoot,         ws.pip_runner,   ws.env};
  child.argv.insert(child.argv.end(), std::begin(kPipInstallArgs), std::end(kPipInstallArgs));
  child.argv.insert(child.argv.end(), {"--report", "-"});
  if (p.only_binary) child.argv.insert(child.argv.end(), {"--only-binary", ":all:"});
  if (!p.index_url.empty()) child.argv.insert(child.argv.end(), {"--index-url", p.index_url});
  if (p.no_index) child.argv.emplace_back("--no-index");
  for (const auto& link : p.find_links) child.argv.insert(child.argv.end(), {"--find-links", link});
  child.argv.insert(child.argv.end(), {"--", spec});
  child.env = pip_environment(ws.pip_tmp);
  // (what is installed read through importlib.metadata, not pkg_resources, which finds
  // nothing where nothing imports)
  child.env.emplace_back("_PIP_USE_IMPORTLIB_METADATA=1");
  child.cwd = ws.pip_tmp;
  child.tail_bytes = 8192;
  ChildOutcome run;
  try {
    run = run_to_completion(child, "", std::chrono::milliseconds(limit_ms), kMaxReportBytes);
  } catch (const ConfigError& e) {
    out.end = PipRun::End::system;
    out.text = std::string("pip could not be started: ") + e.what();
    return out;
  }
  std::string why;  // its temporary files go with it
  python_files::remove_tree(ws.pip_tmp, why);
  python_files::make_dirs(ws.pip_tmp, why);
  std::string tail = run.tail;
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == ' ')) tail.pop_back();
  if (run.ended == ChildOutcome::Ended::timed_out) {
    out.end = PipRun::End::out_of_time;
    return out;
  }
  if (run.ended == ChildOutcome::Ended::output_over_cap) {
    out.text = "pip's report was over " + std::to_string(kMaxReportBytes) + " bytes";
    return out;
  }
  if (run.exit_code == 126 && tail.find("machina-toolhost sandbox") != std::string::npos) {
    out.end = PipRun::End::system;
    out.text = "pip could not be confined: " + tail;
    return out;
  }
  if (run.exit_code != 0) {
    out.text = tail.empty() ? "pip " + run.how : tail;
    return out;
  }
  const json report = json::parse(run.stdout_text, nullptr, false);
  if (!report.is_object()) {
    out.text = "pip's report is not JSON";
    return out;
  }
  for (const auto& item : report.value("install", json::array())) {
    const json meta = item.value("metadata", json::object());
    out.installed.push_back(
        {{"name", meta.value("name", std::string())}, {"version", meta.value("version", std::string())}});
  }
  out.end = PipRun::End::installed;
  return out;
}

}  // namespace

Result PythonPack::install_all(const Call& c, Workspace& ws, const std::vector<std::string>& specs, json& report,
                               std::string& failure) {
  const PythonPolicy& p = policy_.python;
  for (const auto& spec : specs) {
    std::string name;
    Result refusal;
    if (!check_requirement(p, spec, name, refusal)) return refusal;
  }
  const std::int64_t deadline = c.spec.deadline_ms;
  const auto until = std::chrono::steady_clock::time_point(std::chrono::milliseconds(deadline));
  if (!ws.install_mu.try_lock_until(until)) {
    return Result::stopped(RunOutcome::Ending::timed_out, "another install in this workspace ran until the deadline");
  }
  std::lock_guard hold(ws.install_mu, std::adopt_lock);
  std::string why;
  int shared_lock = -1;  // (other hosts using the same workspaces)
  while ((shared_lock = python_files::lock_file(ws.dir + "/install.lock", false, why)) < 0) {
    if (errno != EWOULDBLOCK) return system_error(why);
    if (steady_now_ms() >= deadline) {
      return Result::stopped(RunOutcome::Ending::timed_out,
                             "another host's install in this workspace ran until the deadline");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  struct Unlock {
    int fd;
    ~Unlock() { ::close(fd); }
  } unlock{shared_lock};
  if (ws.pip_runner.empty()) {
    ws.pip_runner = find_pip_runner(ws.base_python, why);
    if (ws.pip_runner.empty()) return system_error(why);
  }
  bool changed = false;
  for (const auto& spec : specs) {
    const std::int64_t left = deadline - steady_now_ms();
    const std::int64_t limit = std::min(p.install_timeout_ms, left);
    if (limit <= 0) return Result::stopped(RunOutcome::Ending::timed_out, "installing " + excerpt(spec));
    PipRun run = run_pip(p, executable_, ws, spec, limit);
    if (run.end == PipRun::End::system) return system_error(run.text);
    if (run.end == PipRun::End::out_of_time) {
      if (limit < p.install_timeout_ms) {
        return Result::stopped(RunOutcome::Ending::timed_out, "pip was installing " + excerpt(spec));
      }
      failure = "Failed to install package " + spec + ": pip ran past the install time limit of " +
                std::to_string(p.install_timeout_ms) + " ms ([python] install_timeout_ms) and was stopped";
      break;
    }
    if (run.end == PipRun::End::failed) {
      failure = "Failed to install package " + spec + ": " + run.text;
      break;
    }
    changed = changed || !run.installed.empty();
    report.push_back({{"package", spec}, {"installed", std::move(run.installed)}});
  }
  if (changed) {
    // Warm workers without a session start again for their next calls: what they imported
    // before may have changed.
    std::shared_ptr<PythonWorkerPool> old;
    {
      std::lock_guard lock(ws.pool_mu);
      old = std::move(ws.pool);
    }
  }
  return Result::ok({});
}

Result PythonPack::install(const Call& c) {
  const std::int64_t started = steady_now_ms();
  const json& field = c.input.at("package");
  if (!field.is_string() || field.get_ref<const std::string&>().empty()) {
    return invalid("package must be a package's name (like 'requests' or 'numpy>=1.26')");
  }
  const std::string spec = field.get<std::string>();
  if (const std::string why = unconfinable(); !why.empty()) return system_error(why);
  Result refusal;
  Workspace* ws = workspace(c, refusal);
  if (ws == nullptr) return refusal;
  json report = json::array();
  std::string failure;
  Result r = install_all(c, *ws, {spec}, report, failure);
  if (r.kind != ErrorKind::none || r.ending != RunOutcome::Ending::ran) return r;
  if (c.shape == Shape::service) {
    if (!failure.empty()) return Result::ok({{"success", false}, {"error", failure}});
    return Result::ok({{"success", true}, {"package", spec}});
  }
  json o = {{"success", failure.empty()}, {"package", spec}};
  if (failure.empty()) {
    json installed = report.empty() ? json::array() : report[0]["installed"];
    o["already_installed"] = installed.empty();
    o["installed"] = std::move(installed);
  } else {
    o["error"] = failure;
  }
  o["duration_ms"] = steady_now_ms() - started;
  return Result::ok(std::move(o));
}

}  // namespace machina::packs
