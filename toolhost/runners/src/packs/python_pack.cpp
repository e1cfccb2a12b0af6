// See python_pack.hpp. Installs are in python_install.cpp, the folders' handling in
// python_files.cpp, the code runner itself in python/machina_dispatch/python_exec.py.
#include "python_pack.hpp"

#include "python_files.hpp"

#include <machina/child_process.hpp>
#include <machina/errors.hpp>
#include <machina/clock.hpp>
#include <machina/isolation/sandbox_exec.hpp>
#include <machina/python_exec_source.hpp>
#include <machina/tool_protocol.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

namespace machina::packs {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kMaxSessionIdBytes = 128;
constexpr const char* kEntryExecute = "machina_python_exec:execute";
constexpr const char* kEntryList = "machina_python_exec:list_packages";

/// Where workspaces live when the policy does not say: beside the skills' data
/// (docs/operations.md), $XDG_STATE_HOME/machina-toolhost/python.
std::string default_workspaces() {
  std::string base;
  if (const char* state = std::getenv("XDG_STATE_HOME"); state != nullptr && *state == '/') base = state;
  else if (const char* home = std::getenv("HOME"); home != nullptr && *home == '/') base = std::string(home) + "/.local/state";
  else base = "/tmp/machina-toolhost-" + std::to_string(::getuid());
  return base + "/machina-toolhost/python";
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

bool valid_session_id(const std::string& id) {
  if (id.empty() || id.size() > kMaxSessionIdBytes || id == "." || id == "..") return false;
  return std::all_of(id.begin(), id.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.';
  });
}

std::string real_path(const std::string& path) {
  std::error_code ec;
  const auto r = std::filesystem::canonical(path, ec);
  return ec ? path : r.string();
}

/// A failure of the code's own, as the code runner answers one (for what it cannot answer
/// itself: its interpreter killed).
json failure(const std::string& type, const std::string& message, const std::string& advice, double ms) {
  return {{"success", false},           {"error", type + ": " + message}, {"error_type", type},
          {"traceback", nullptr},       {"advice", advice},               {"line", nullptr},
          {"stdout", ""},               {"stderr", ""},                   {"stdout_truncated", false},
          {"stderr_truncated", false},  {"execution_ms", ms},             {"threads", 0}};
}

/// An answer of the code runner's in the shape a name of the tool gives.
json shaped(const json& a, Shape shape) {
  const bool ok = a.value("success", false);
  json o = {{"success", ok}};
  if (ok) {
    o["result"] = a.contains("result") ? a["result"] : json();
  } else {
    o["error"] = a.value("error", std::string("Error"));
    o["traceback"] = a.contains("traceback") ? a["traceback"] : json();
    o["advice"] = a.contains("advice") ? a["advice"] : json();
  }
  o["stdout"] = a.value("stdout", std::string());
  o["stderr"] = a.value("stderr", std::string());
  o["executionTime"] = a.value("execution_ms", 0.0);
  if (shape == Shape::seed) return o;
  const bool out_cut = a.value("stdout_truncated", false), err_cut = a.value("stderr_truncated", false);
  o["stdout_truncated"] = out_cut;
  o["stderr_truncated"] = err_cut;
  o["truncated"] = out_cut || err_cut;
  if (ok) {
    o["result_truncated"] = a.value("result_truncated", false);
  } else {
    o["error_type"] = a.value("error_type", std::string());
    o["line"] = a.contains("line") ? a["line"] : json();
  }
  return o;
}

/// What a worker's answer carries: the code runner's object, or why there is none.
bool decode(const PythonWorkerPool::Exchange& ex, json& out, std::string& why) {
  tool_protocol::Answer answer;
  if (!tool_protocol::decode_answer(ex.answer, answer, why)) return false;
  if (!answer.ok) {
    why = answer.error_type + ": " + answer.error_message;
    return false;
  }
  out = json::parse(answer.result, nullptr, false);
  if (!out.is_object()) {
    why = "the code runner's answer is not an object";
    return false;
  }
  return true;
}

}  // namespace

PythonPack::Workspace::~Workspace() {
  if (run_lock >= 0) ::close(run_lock);
}

/// A session: one worker reserved for it, keeping the code's names between its calls.
struct PythonPack::Session {
  std::string key;  // workspace scope, user and id
  std::string id;
  std::string dir;  // <run>/sessions/<serial>-<id>: the code's own folder
  std::shared_ptr<PythonWorkerPool> pool;
  std::timed_mutex running;  // one call at a time
  // Guarded by sessions_mu_:
  std::size_t holders = 0;  // calls running or waiting to
  Clock::time_point last_used;
  bool ended = false;
};

PythonPack::PythonPack(const Policy& policy, std::string executable)
    : policy_(policy), executable_(std::move(executable)) {
  std::random_device random;
  char id[40];
  std::snprintf(id, sizeof id, "%d-%08x%08x", static_cast<int>(::getpid()), random(), random());
  host_id_ = id;
}

PythonPack::~PythonPack() {
  close();
  {
    std::lock_guard lock(sessions_mu_);
    stop_reaper_ = true;
  }
  sessions_cv_.notify_all();
  if (reaper_.joinable()) reaper_.join();
}

void PythonPack::close() {
  std::vector<Workspace*> spaces;
  {
    std::lock_guard lock(mu_);
    if (closed_) return;
    closed_ = true;
    for (auto& [_, ws] : workspaces_) spaces.push_back(ws.get());
  }
  std::vector<std::shared_ptr<Session>> all;
  {
    std::lock_guard lock(sessions_mu_);
    for (auto& [_, s] : sessions_) all.push_back(s);
  }
  for (auto& s : all) end_session(s);
  for (Workspace* ws : spaces) {
    std::shared_ptr<PythonWorkerPool> pool;
    {
      std::lock_guard lock(ws->pool_mu);
      pool = std::move(ws->pool);
    }
    if (pool) pool->close();
    pool.reset();
    std::string why;
    if (!ws->run.empty()) python_files::remove_tree(ws->run, why);
  }
}

std::size_t PythonPack::sessions() const {
  std::lock_guard lock(sessions_mu_);
  return sessions_.size();
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
  } catch (const HostError& e) {
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
  struct stat st {};
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
  } catch (const HostError& e) {
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

// --- sessions ---------------------------------------------------------------------------

std::shared_ptr<PythonPack::Session> PythonPack::acquire(Workspace& ws, std::string_view user, const std::string& id,
                                                         std::int64_t deadline_ms, bool& fresh, Result& refusal) {
  const PythonPolicy& p = policy_.python;
  const std::string key = ws.scope + '\n' + std::string(user) + '\n' + id;
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::shared_ptr<Session> s;
    std::shared_ptr<Session> evicted;
    {
      std::lock_guard lock(sessions_mu_);
      if (auto it = sessions_.find(key); it != sessions_.end()) {
        s = it->second;
        ++s->holders;
        fresh = false;
      } else {
        if (p.max_sessions == 0) {
          refusal = denied("the policy allows no Python session ([python] max_sessions = 0); run the code without a "
                           "session_id");
          return nullptr;
        }
        if (sessions_.size() >= p.max_sessions) {
          // Room is made by ending the session unused the longest; one running a call is never ended.
          for (auto& [_, other] : sessions_) {
            if (other->holders == 0 && (!evicted || other->last_used < evicted->last_used)) evicted = other;
          }
          if (!evicted) {
            refusal = system_error("all " + std::to_string(p.max_sessions) +
                                   " Python sessions the policy allows are running calls; try again when one is done, "
                                   "or run the code without a session_id");
            return nullptr;
          }
          evicted->ended = true;
          sessions_.erase(evicted->key);
        }
        s = std::make_shared<Session>();
        s->key = key;
        s->id = id;
        s->dir = ws.sessions + "/" + std::to_string(++ws.serial) + "-" + id;
        s->holders = 1;
        s->last_used = Clock::now();
        s->running.lock();  // (free: nobody else has it yet)
        sessions_.emplace(key, s);
        fresh = true;
        if (!reaper_.joinable()) reaper_ = std::thread([this] { reap_loop(); });
        sessions_cv_.notify_all();
      }
    }
    if (evicted) end_session(evicted);
    if (fresh) {
      std::string why;
      if (!python_files::make_dirs(s->dir, why)) {
        release(s, false);
        refusal = system_error("a folder for session " + id + " cannot be made: " + why);
        return nullptr;
      }
      s->pool = make_pool(ws, s->dir, 1);
      return s;
    }
    if (!s->running.try_lock_until(Clock::time_point(std::chrono::milliseconds(deadline_ms)))) {
      std::lock_guard lock(sessions_mu_);
      --s->holders;
      refusal = Result::stopped(RunOutcome::Ending::timed_out,
                                "Python session " + id + " was running another call until the deadline");
      return nullptr;
    }
    bool ended = false;
    {
      std::lock_guard lock(sessions_mu_);
      ended = s->ended;
      if (ended) --s->holders;
    }
    if (!ended) return s;
    s->running.unlock();  // it ended while this call waited: a new one
  }
  refusal = system_error("Python session " + id + " kept ending while this call waited for it");
  return nullptr;
}

void PythonPack::release(const std::shared_ptr<Session>& s, bool keep) {
  if (!keep) end_session(s);
  {
    std::lock_guard lock(sessions_mu_);
    s->last_used = Clock::now();
    --s->holders;
  }
  s->running.unlock();
  sessions_cv_.notify_all();
}

void PythonPack::end_session(const std::shared_ptr<Session>& s) {
  {
    std::lock_guard lock(sessions_mu_);
    if (auto it = sessions_.find(s->key); it != sessions_.end() && it->second == s) sessions_.erase(it);
    s->ended = true;
  }
  // Its worker is gone before its folder is (nothing left to write into it).
  auto pool = std::move(s->pool);
  if (pool) pool->close();
  pool.reset();
  std::string why;
  python_files::remove_tree(s->dir, why);
}

void PythonPack::reap_loop() {
  std::unique_lock lock(sessions_mu_);
  while (!stop_reaper_) {
    const auto idle = std::chrono::milliseconds(policy_.python.session_idle_ms);
    const auto now = Clock::now();
    std::vector<std::shared_ptr<Session>> expired;
    auto next = now + std::chrono::hours(1);
    for (auto& [_, s] : sessions_) {
      if (s->holders != 0) continue;  // (released: it is looked at again then)
      if (now - s->last_used >= idle) expired.push_back(s);
      else next = std::min(next, s->last_used + idle);
    }
    if (!expired.empty()) {
      for (auto& s : expired) {
        s->ended = true;
        sessions_.erase(s->key);
      }
      lock.unlock();
      for (auto& s : expired) end_session(s);
      lock.lock();
      continue;
    }
    sessions_cv_.wait_until(lock, next);
  }
}

// --- the tools --------------------------------------------------------------------------

Result PythonPack::execute(const Call& c) {
  const PythonPolicy& p = policy_.python;
  const std::int64_t started = steady_now_ms();
  const json& code_field = c.input.at("code");
  if (!code_field.is_string()) return invalid("code must be a string");
  const std::string& code = code_field.get_ref<const std::string&>();
  if (code.size() > p.max_code_bytes) {
    return invalid("code of " + std::to_string(code.size()) + " bytes is over the limit of " +
                   std::to_string(p.max_code_bytes) + " ([python] max_code_bytes)");
  }
  std::vector<std::string> specs;
  if (auto it = c.input.find("install_packages"); it != c.input.end() && !it->is_null()) {
    if (!it->is_array()) return invalid("install_packages must be a list of package names");
    for (const auto& s : *it) {
      if (!s.is_string()) return invalid("install_packages must be a list of package names");
      specs.push_back(s.get<std::string>());
    }
    if (specs.size() > p.max_install_packages) {
      return invalid("at most " + std::to_string(p.max_install_packages) +
                     " packages may be installed by one call ([python] max_install_packages)");
    }
  }
  bool sync = false;
  if (auto it = c.input.find("sync_workspace"); it != c.input.end() && !it->is_null()) {
    if (!it->is_boolean()) return invalid("sync_workspace must be true or false");
    sync = it->get<bool>();
  }
  std::string session_id;
  if (auto it = c.input.find("session_id"); it != c.input.end() && !it->is_null()) {
    if (!it->is_string() || !valid_session_id(it->get<std::string>())) {
      return invalid("session_id must be 1 to 128 letters, digits, '-', '_' or '.'");
    }
    session_id = it->get<std::string>();
  }
  if (const std::string why = unconfinable(); !why.empty()) {
    // The runtime is not ready: an answer of the code runner's, which a caller reads as a
    // failed run with advice, not a host error (nothing ran).
    return Result::ok(shaped(failure("RuntimeNotReady", why,
                                     "Nothing was run. Python code runs only confined: run the host on a Linux "
                                     "kernel with user namespaces and Landlock (5.13 or later), and without "
                                     "MACHINA_TOOLHOST_NO_LANDLOCK=1.",
                                     0.0),
                             c.shape));
  }
  Result refusal;
  Workspace* ws = workspace(c, refusal);
  if (ws == nullptr) return refusal;

  json extra = json::object();  // ours: what the call did besides running the code
  if (!specs.empty()) {
    json installed = json::array();
    std::string failed;
    Result r = install_all(c, *ws, specs, installed, failed);
    if (r.kind != ErrorKind::none || r.ending != RunOutcome::Ending::ran) return r;
    extra["installed"] = std::move(installed);
    if (!failed.empty()) {
      if (c.shape == Shape::seed) return Result::ok({{"success", false}, {"error", failed}});
      json o = {{"success", false}, {"error", failed}, {"error_type", "InstallError"}, {"traceback", nullptr},
                {"advice", "Nothing was run. Check the package's name as pip knows it (install_python_package "
                           "gives pip's whole answer), or run the code without it."},
                {"stdout", ""}, {"stderr", ""}, {"executionTime", 0}, {"duration_ms", steady_now_ms() - started}};
      o.update(extra);
      return Result::ok(std::move(o));
    }
  }

  // Where the code runs: its session's folder, or a fresh one of its own.
  std::shared_ptr<Session> session;
  bool fresh = false;
  std::string dir;
  std::shared_ptr<PythonWorkerPool> pool;
  std::string why;
  if (!session_id.empty()) {
    session = acquire(*ws, c.user, session_id, c.spec.deadline_ms, fresh, refusal);
    if (!session) return refusal;
    dir = session->dir;
    pool = session->pool;
  } else {
    dir = take_folder(*ws, why);
    if (dir.empty()) return system_error("a folder for the code cannot be made: " + why);
    pool = stateless_pool(*ws);
  }
  bool keep = true;  // the session (false: its worker is gone, and with it its names)
  struct Done {
    PythonPack* pack;
    Workspace& ws;
    std::shared_ptr<Session>& session;
    const std::string& dir;
    bool& keep;
    ~Done() {
      if (session) pack->release(session, keep);
      else give_back_folder(ws, dir);
    }
  } done{this, *ws, session, dir, keep};

  if (sync) {
    std::string root_why;
    const std::vector<std::string>* roots = c.policy.roots_for(c.user, root_why);
    std::vector<std::pair<dev_t, ino_t>> skip;
    struct stat st {};
    if (::stat(ws->dir.c_str(), &st) == 0) skip.emplace_back(st.st_dev, st.st_ino);
    python_files::Copied copied;
    const auto end =
        python_files::copy_root(c.policy, roots->front(), dir, skip, p.sync_max_files, p.sync_max_bytes, copied, why);
    if (end == python_files::CopyEnd::over_cap) {
      return system_error("the workspace " + roots->front() + " has more than " + std::to_string(p.sync_max_files) +
                          " files or " + std::to_string(p.sync_max_bytes) +
                          " bytes to copy for the code ([python] sync_max_files, sync_max_bytes)");
    }
    if (end == python_files::CopyEnd::failed) return system_error("the workspace could not be copied: " + why);
    extra["synced"] = {{"files", copied.files}, {"bytes", copied.bytes}, {"skipped", copied.skipped}};
  }

  // Without a session the interpreter runs this one call: it may change nothing but its
  // folder (not the other call folders beside it, which its walls' writable root holds).
  const json payload = {{"code", code},
                        {"cwd", dir},
                        {"own_folder_only", session == nullptr},
                        {"session", session != nullptr},
                        {"session_new", fresh},
                        {"max_output_bytes", p.max_output_bytes},
                        {"max_result_bytes", p.max_result_bytes},
                        {"cpu_seconds", p.cpu_seconds},
                        {"memory_mb", p.memory_mb}};
  const std::string payload_text = payload.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string line;
  tool_protocol::encode_local_call(
      {"execute_python", kEntryExecute, payload_text, true, c.spec.trace_id, {}, c.spec.deadline_ms}, line);
  line.push_back('\n');
  // An interpreter that ran a call's code without a session runs no other call: nothing the
  // code left in it (a patched runner or builtins, a hook, a thread) reaches a later call.
  // Its replacement starts as soon as it is retired. (A session's interpreter is its own,
  // retired by the pool when its code leaves threads running.)
  static const PythonWorkerPool::Retire one_call = [](std::string_view) { return true; };
  const std::int64_t ran_from = steady_now_ms();
  // The time limit counts from when the code starts: waiting for a free worker is bounded by
  // the call's deadline alone.
  const PythonWorkerPool::Exchange ex =
      pool->call(line, c.spec.deadline_ms, c.spec.cancel, session ? nullptr : &one_call, p.timeout_ms, c.user);
  const double ran_ms = static_cast<double>(steady_now_ms() - ran_from);
  const std::string lost = session ? "; session " + session_id + "'s variables are lost (its interpreter was killed)"
                                   : std::string();

  json answer;
  using Ending = PythonWorkerPool::Exchange::Ending;
  switch (ex.ending) {
    case Ending::answered:
      if (!decode(ex, answer, why)) {
        if (why.rfind("TimeoutError", 0) == 0) return Result::stopped(RunOutcome::Ending::timed_out, why);
        pool->condemn(ex.pid, "answered execute_python with no result and was replaced");
        keep = false;
        return system_error("the code runner failed: " + why.substr(0, 2000));
      }
      if (ex.retired) keep = false;  // (a session's code left threads running)
      break;
    case Ending::timed_out:
      if (!ex.killed) return Result::stopped(RunOutcome::Ending::timed_out, ex.detail);
      keep = false;
      if (!ex.over_run) return Result::stopped(RunOutcome::Ending::timed_out, "the code ran past the call's deadline" + lost);
      answer = failure("TimeoutError",
                       "the code ran past its time limit of " + std::to_string(p.timeout_ms) + " ms and was stopped",
                       "Make the code faster, or split the work over several calls" +
                           std::string(session ? ": this session's variables are lost (its interpreter was killed), "
                                                 "so define them again first."
                                               : " (a session_id keeps variables between them)."),
                       ran_ms);
      break;
    case Ending::crashed:
      if (ex.pid == 0 || (ex.detail.find("status 126") != std::string::npos &&
                          ex.detail.find("machina-toolhost sandbox") != std::string::npos)) {
        keep = false;
        return system_error("the code's interpreter could not be started in its walls: " + ex.detail.substr(0, 2000));
      }
      keep = false;
      answer = failure("SystemError", "the interpreter running the code ended: " + ex.detail.substr(0, 2000),
                       "The interpreter itself stopped (os._exit, a signal, a crash in an extension module)" +
                           std::string(session ? "; this session's variables are lost, so define them again first."
                                               : "."),
                       ran_ms);
      break;
    case Ending::closed: keep = false; return Result::stopped(RunOutcome::Ending::closed);
    case Ending::cancelled:
      keep = !ex.killed;
      return Result::stopped(RunOutcome::Ending::cancelled, ex.detail);
  }
  json o = shaped(answer, c.shape);
  if (c.shape == Shape::ours) {
    o["duration_ms"] = steady_now_ms() - started;
    if (session) {
      o["session_id"] = session_id;
      o["session_new"] = fresh;
      o["session_ended"] = !keep;
    }
    o.update(extra);
  }
  return Result::ok(std::move(o));
}

// The distributions of an interpreter's own site folders, as JSON on stdout: read without
// the site initialisation (-S), so that no installed package's code runs.
constexpr const char* kListWithoutSite = R"(import json, site, sys
from importlib import metadata
found = {}
for d in metadata.distributions(path=site.getsitepackages()):
    name = d.metadata["Name"] if d.metadata is not None else None
    if name:
        found.setdefault("-".join(name.lower().replace("_", "-").replace(".", "-").split("-")),
                         {"name": name, "version": d.version or ""})
out = sorted(found.values(), key=lambda p: p["name"].lower())
print(json.dumps({"python": sys.executable, "packages": out[:10000], "truncated": len(out) > 10000}))
)";

Result PythonPack::list_without_workspace(const Call& c) {
  std::string python;
  try {
    python = resolve_interpreter(policy_.python.python, ".");
  } catch (const HostError& e) {
    return system_error(std::string("the Python interpreter of the policy ([python] python): ") + e.what());
  }
  ChildSpec spec;
  spec.executable = python;
  spec.argv = {python, "-I", "-S", "-c", kListWithoutSite};
  spec.env = pick_environment({"PATH", "LANG"});
  const auto left = std::max<std::int64_t>(1, c.spec.deadline_ms - steady_now_ms());
  const auto ran = run_to_completion(spec, "", std::chrono::milliseconds(left), 8 << 20);
  json answer = ran.ended == ChildOutcome::Ended::exited && ran.exit_code == 0
                    ? json::parse(ran.stdout_text, nullptr, false)
                    : json();
  if (!answer.is_object() || !answer.contains("packages") || !answer["packages"].is_array()) {
    return system_error("the packages could not be listed: python " + ran.how +
                        (ran.tail.empty() ? "" : ": " + ran.tail.substr(0, 2000)));
  }
  json packages = json::array();
  for (const auto& pkg : answer["packages"]) {
    json entry = {{"name", pkg.value("name", std::string())}, {"version", pkg.value("version", std::string())}};
    if (c.shape == Shape::ours) entry["installed"] = false;  // (no workspace: nothing of its own)
    packages.push_back(std::move(entry));
  }
  json o = {{"success", true}, {"packages", std::move(packages)}};
  if (c.shape == Shape::ours) {
    o["python"] = answer.value("python", python);
    o["environment"] = nullptr;
    o["truncated"] = answer.value("truncated", false);
  }
  return Result::ok(std::move(o));
}

Result PythonPack::list(const Call& c) {
  // Where code cannot be confined nothing is made ready, but what the interpreter offers
  // can still be read.
  if (!unconfinable().empty()) return list_without_workspace(c);
  Result refusal;
  Workspace* ws = workspace(c, refusal);
  if (ws == nullptr) return refusal;
  auto pool = stateless_pool(*ws);
  const std::string payload = json{{"cwd", ws->calls}}.dump();
  std::string line;
  tool_protocol::encode_local_call(
      {"list_python_packages", kEntryList, payload, true, c.spec.trace_id, {}, c.spec.deadline_ms}, line);
  line.push_back('\n');
  const PythonWorkerPool::Exchange ex = pool->call(line, c.spec.deadline_ms, c.spec.cancel);
  using Ending = PythonWorkerPool::Exchange::Ending;
  switch (ex.ending) {
    case Ending::answered: break;
    case Ending::timed_out: return Result::stopped(RunOutcome::Ending::timed_out, ex.detail);
    case Ending::cancelled: return Result::stopped(RunOutcome::Ending::cancelled, ex.detail);
    case Ending::closed: return Result::stopped(RunOutcome::Ending::closed);
    case Ending::crashed: return system_error("the workspace's interpreter ended: " + ex.detail.substr(0, 2000));
  }
  json answer;
  std::string why;
  if (!decode(ex, answer, why)) return system_error("the packages could not be listed: " + why.substr(0, 2000));
  json packages = json::array();
  for (const auto& pkg : answer.value("packages", json::array())) {
    json entry = {{"name", pkg.value("name", std::string())}, {"version", pkg.value("version", std::string())}};
    if (c.shape == Shape::ours) entry["installed"] = pkg.value("installed", false);
    packages.push_back(std::move(entry));
  }
  json o = {{"success", true}, {"packages", std::move(packages)}};
  if (c.shape == Shape::ours) {
    o["python"] = answer.value("python", std::string());
    o["environment"] = ws->env;
    o["truncated"] = answer.value("truncated", false);
  }
  return Result::ok(std::move(o));
}

Result python_execute(const Call& c) { return c.python->execute(c); }
Result python_install(const Call& c) { return c.python->install(c); }
Result python_list(const Call& c) { return c.python->list(c); }

}  // namespace machina::packs
