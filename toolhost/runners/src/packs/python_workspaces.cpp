// See python_pack.hpp: the workspaces of execute_python (a scope's folder, its virtual
// environment, this host's run folder in it), the walls of the interpreters that run code
// in them, and the folders of calls without a session.
#include "python_pack.hpp"

#include "python_files.hpp"

#include <machina/child_process.hpp>
#include <machina/errors.hpp>
#include <machina/isolation/sandbox_exec.hpp>
#include <machina/python_exec_source.hpp>
#include <machina/runners/python_interpreter.hpp>
#include <machina/state_home.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace machina::packs {
namespace {

/// Where workspaces live when the policy does not say: beside the skills' data
/// (docs/operations.md), $XDG_STATE_HOME/machina-toolhost/python.
std::string default_workspaces() {
  return toolhost_state_dir() + "/python";
}

/// A scope's folder name: "default", or the user's name made safe, with a hash of it (two
/// names that look alike once made safe stay apart).
std::string folder_of(const std::string& scope) {
  if (scope.empty()) return "default";
  std::uint64_t hash = 1469598103934665603ULL;  // FNV-1a
  std::string safe;
  for (char ch : scope) {
    hash = (hash ^ static_cast<unsigned char>(ch)) * 1099511628211ULL;
    if (safe.size() < 40) safe.push_back(std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' ? ch : '_');
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  return "user-" + safe + "-" + hex;
}

std::string real_path(const std::string& path) {
  std::error_code ec;
  const auto r = std::filesystem::canonical(path, ec);
  return ec ? path : r.string();
}

}  // namespace

PythonPack::Workspace::~Workspace() {
  if (run_lock >= 0) ::close(run_lock);
}

std::string PythonPack::unconfinable() const {
  const sandbox::Support& support = sandbox::support();
  if (!support.namespaces) return "Python code cannot be confined here: " + support.namespaces_why;
  if (executable_.empty()) return "Python code cannot be confined: the machina-toolhost launcher is unknown";
  if (support.landlock_abi < 1) {
    return "Python code cannot be confined here: writing only its own folder needs Landlock, which this kernel "
           "does not offer (or MACHINA_TOOLHOST_NO_LANDLOCK=1 turned it off)";
  }
  return {};
}

PythonPack::Workspace* PythonPack::workspace(const Call& c, Result& refusal) {
  std::string why;
  if (c.policy.roots_for(c.user, why) == nullptr) {
    refusal = denied(why);
    return nullptr;
  }
  const std::string scope = policy_.scope_of(c.user);
  std::lock_guard lock(mu_);
  if (closed_) {
    refusal = Result::stopped(RunOutcome::Ending::closed);
    return nullptr;
  }
  if (auto it = workspaces_.find(scope); it != workspaces_.end()) return it->second.get();

  const PythonPolicy& p = policy_.python;
  auto ws = std::make_unique<Workspace>();
  ws->scope = scope;
  try {
    ws->base_python = resolve_interpreter(p.python, ".");
  } catch (const ConfigError& e) {
    refusal = system_error(std::string("the Python interpreter of the policy ([python] python): ") + e.what());
    return nullptr;
  }
  ws->dir = (p.workspaces.empty() ? default_workspaces() : p.workspaces) + "/" + folder_of(scope);
  ws->env = ws->dir + "/env";
  ws->python = ws->env + "/bin/python";
  ws->run = ws->dir + "/run/" + host_id_;
  ws->calls = ws->run + "/calls";
  ws->sessions = ws->run + "/sessions";
  ws->pip_tmp = ws->run + "/pip";
  auto fail = [&](const std::string& what) {
    refusal = system_error("the Python workspace " + ws->dir + " cannot be made ready: " + what);
    return nullptr;
  };
  if (!python_files::make_dirs(ws->dir + "/run", why)) return fail(why);
  // Hosts that share the workspaces make theirs ready one at a time: a host's run folder
  // is locked before the next host looks for stale ones (whose lock is free).
  const int setup = python_files::lock_file(ws->dir + "/lock", true, why);
  if (setup < 0) return fail(why);
  struct Unlock {
    int fd;
    ~Unlock() { ::close(fd); }
  } unlock{setup};
  struct stat st{};
  if (::stat((ws->env + "/pyvenv.cfg").c_str(), &st) != 0) {
    ChildSpec venv;
    venv.executable = ws->base_python;
    venv.argv = {ws->base_python, "-m", "venv", "--without-pip", "--system-site-packages", ws->env};
    venv.env = pick_environment({"PATH", "HOME", "LANG", "PYENV_VERSION", "PYENV_ROOT"});
    const auto made = run_to_completion(venv, "", std::chrono::seconds(120), 1 << 20);
    if (made.ended != ChildOutcome::Ended::exited || made.exit_code != 0) {
      return fail("python -m venv " + made.how + (made.tail.empty() ? "" : ": " + made.tail));
    }
  }
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(ws->dir + "/run", ec)) {
    const std::string other = e.path().string();
    const int stale = python_files::lock_file(other + "/lock", false, why);
    if (stale < 0) continue;  // a live host's (or not a folder)
    python_files::remove_tree(other, why);
    ::close(stale);
  }
  if (!python_files::make_dirs(ws->run, why)) return fail(why);
  ws->run_lock = python_files::lock_file(ws->run + "/lock", false, why);
  if (ws->run_lock < 0) return fail(why);
  for (const auto* d : {&ws->calls, &ws->sessions, &ws->pip_tmp}) {
    if (!python_files::make_dirs(*d, why)) return fail(why);
  }
  try {
    ws->files = interpreter_files(ws->python);
  } catch (const ConfigError& e) {
    return fail(e.what());
  }
  Workspace* out = ws.get();
  workspaces_.emplace(scope, std::move(ws));
  return out;
}

std::shared_ptr<PythonWorkerPool> PythonPack::make_pool(const Workspace& ws, const std::string& writable,
                                                        std::size_t workers) const {
  const PythonPolicy& p = policy_.python;
  sandbox::ExecSpec walls;
  walls.own_network = walls.no_sockets = true;
  walls.no_processes = true;
  walls.restrict_exec = true;
  const std::string interpreter = real_path(ws.files.executable);
  walls.exec_paths = {interpreter};
  if (auto loader = sandbox::elf_interpreter(interpreter); !loader.empty()) walls.exec_paths.push_back(loader);
  walls.restrict_write = true;
  walls.write_paths = {writable};
  walls.restrict_read = true;
  walls.read_paths = ws.files.paths;
  walls.read_paths.insert(walls.read_paths.end(), p.read_paths.begin(), p.read_paths.end());
  if (const char* key = std::getenv("MACHINA_LEASE_KEY_FILE"); key != nullptr && *key != '\0') {
    walls.hidden_files.emplace_back(key);
  }
  walls.address_space_mb = p.memory_mb;  // (resident memory cannot grow past it: no watch needed)
  walls.open_files = p.open_files;
  walls.file_size_mb = p.file_size_mb;
  walls.write_quota_mb = p.folder_quota_mb;

  PythonPoolOptions o;
  o.python = ws.python;
  o.cwd = writable;
  o.env = {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + writable, "TMPDIR=" + writable, "LANG=C.UTF-8",
           "LC_ALL=C.UTF-8", "PYTHONHASHSEED=0", "PYTHONDONTWRITEBYTECODE=1", "PYTHONNOUSERSITE=1",
           "PYTHONIOENCODING=utf-8",
           // Numerical libraries start no thread pools of their own: a thread left after a call
           // ends its session (the pool retires an interpreter with threads left running).
           "OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1", "MKL_NUM_THREADS=1"};
  o.launcher = {executable_, "--sandbox-exec", walls.to_json(), "--"};
  o.workers = workers;
  o.queue_depth = 1;
  o.replace_retired = true;  // (calls without a session retire theirs)
  o.max_answer_bytes = 2 * p.max_output_bytes + p.max_result_bytes + (1u << 20);
  o.worker_args = {"--module", "machina_python_exec=" + std::string(kPythonExecSource)};
  return std::make_shared<PythonWorkerPool>(std::move(o));
}

std::string PythonPack::take_folder(Workspace& ws, std::string& why) {
  const std::string name = std::to_string(++ws.serial);
  {
    std::lock_guard lock(ws.folders_mu);
    ws.folders.insert(name);  // (before it exists: a sweep never takes it for a stray)
  }
  std::string dir = ws.calls + "/" + name;
  if (::mkdir(dir.c_str(), 0700) != 0) {
    why = "cannot make " + dir + ": " + std::strerror(errno);
    std::lock_guard lock(ws.folders_mu);
    ws.folders.erase(name);
    return {};
  }
  return dir;
}

void PythonPack::give_back_folder(Workspace& ws, const std::string& dir) {
  // Never used again: a thread of the retired interpreter may write into it until the
  // interpreter is gone, and a removed folder takes no new entries.
  std::string why;
  python_files::remove_tree(dir, why);
  {
    std::lock_guard lock(ws.folders_mu);
    ws.folders.erase(dir.substr(dir.rfind('/') + 1));
  }
  // Code may write beside its folder (their parent is the interpreters' writable root):
  // whatever is not a call folder goes.
  std::error_code ec;
  std::vector<std::string> strays;
  for (const auto& e : std::filesystem::directory_iterator(ws.calls, ec)) {
    const std::string name = e.path().filename().string();
    std::lock_guard lock(ws.folders_mu);
    if (ws.folders.count(name) == 0) strays.push_back(e.path().string());
  }
  for (const auto& stray : strays) python_files::remove_tree(stray, why);
}

std::shared_ptr<PythonWorkerPool> PythonPack::stateless_pool(Workspace& ws) {
  std::lock_guard lock(ws.pool_mu);
  if (!ws.pool) ws.pool = make_pool(ws, ws.calls, policy_.python.workers);
  return ws.pool;
}

}  // namespace machina::packs
