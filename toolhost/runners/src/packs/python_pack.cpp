// See python_pack.hpp: execute_python itself, and the pack's life. The workspaces are in
// python_workspaces.cpp, the sessions in python_sessions.cpp, installs in python_install.cpp,
// listing in python_package_list.cpp, the folders' handling in python_files.cpp, the code
// runner itself in python/machina_dispatch/python_exec.py.
#include "python_pack.hpp"

#include "python_files.hpp"

#include <machina/child_process.hpp>
#include <machina/clock.hpp>
#include <machina/errors.hpp>
#include <machina/isolation/sandbox_exec.hpp>
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

constexpr std::size_t kMaxSessionIdBytes = 128;
constexpr const char* kEntryExecute = "machina_python_exec:execute";

bool valid_session_id(const std::string& id) {
  if (id.empty() || id.size() > kMaxSessionIdBytes || id == "." || id == "..") return false;
  return std::all_of(id.begin(), id.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.';
  });
}

/// A failure of the code's own, as the code runner answers one (for what it cannot answer
/// itself: its interpreter killed).
json failure(const std::string& type, const std::string& message, const std::string& advice, double ms) {
  return {{"success", false},
          {"error", type + ": " + message},
          {"error_type", type},
          {"traceback", nullptr},
          {"advice", advice},
          {"line", nullptr},
          {"stdout", ""},
          {"stderr", ""},
          {"stdout_truncated", false},
          {"stderr_truncated", false},
          {"execution_ms", ms},
          {"threads", 0}};
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
  if (shape == Shape::service) return o;
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

}  // namespace

bool decode_code_runner_answer(const PythonWorkerPool::Exchange& ex, json& out, std::string& why) {
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
  std::vector<std::shared_ptr<ReplSession>> all;
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

  json extra = json::object();  // detailed answers: what the call did besides running the code
  if (!specs.empty()) {
    json installed = json::array();
    std::string failed;
    Result r = install_all(c, *ws, specs, installed, failed);
    if (r.kind != ErrorKind::none || r.ending != RunOutcome::Ending::ran) return r;
    extra["installed"] = std::move(installed);
    if (!failed.empty()) {
      if (c.shape == Shape::service) return Result::ok({{"success", false}, {"error", failed}});
      json o = {{"success", false},
                {"error", failed},
                {"error_type", "InstallError"},
                {"traceback", nullptr},
                {"advice",
                 "Nothing was run. Check the package's name as pip knows it (install_python_package "
                 "gives pip's whole answer), or run the code without it."},
                {"stdout", ""},
                {"stderr", ""},
                {"executionTime", 0},
                {"duration_ms", steady_now_ms() - started}};
      o.update(extra);
      return Result::ok(std::move(o));
    }
  }

  // Where the code runs: its session's folder, or a fresh one of its own.
  std::shared_ptr<ReplSession> session;
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
    std::shared_ptr<ReplSession>& session;
    const std::string& dir;
    bool& keep;
    ~Done() {
      if (session)
        pack->release(session, keep);
      else
        give_back_folder(ws, dir);
    }
  } done{this, *ws, session, dir, keep};

  if (sync) {
    std::string root_why;
    const std::vector<std::string>* roots = c.policy.roots_for(c.user, root_why);
    std::vector<std::pair<dev_t, ino_t>> skip;
    struct stat st{};
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
  const std::string lost =
      session ? "; session " + session_id + "'s variables are lost (its interpreter was killed)" : std::string();

  json answer;
  using Ending = PythonWorkerPool::Exchange::Ending;
  switch (ex.ending) {
    case Ending::answered:
      if (!decode_code_runner_answer(ex, answer, why)) {
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
      if (!ex.over_run)
        return Result::stopped(RunOutcome::Ending::timed_out, "the code ran past the call's deadline" + lost);
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
      answer =
          failure("SystemError", "the interpreter running the code ended: " + ex.detail.substr(0, 2000),
                  "The interpreter itself stopped (os._exit, a signal, a crash in an extension module)" +
                      std::string(session ? "; this session's variables are lost, so define them again first." : "."),
                  ran_ms);
      break;
    case Ending::closed: keep = false; return Result::stopped(RunOutcome::Ending::closed);
    case Ending::cancelled: keep = !ex.killed; return Result::stopped(RunOutcome::Ending::cancelled, ex.detail);
  }
  json o = shaped(answer, c.shape);
  if (c.shape == Shape::detailed) {
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

Result python_execute(const Call& c) {
  return c.python->execute(c);
}
Result python_install(const Call& c) {
  return c.python->install(c);
}
Result python_list(const Call& c) {
  return c.python->list(c);
}

}  // namespace machina::packs
