// shell.exec: one program with its arguments, never through a shell, if the policy's
// allow list names it and its deny list does not; run in the sandbox launcher's walls (no
// network, no new processes, writing only beneath the caller's roots, executing only the
// allowed programs whatever starts them, CPU, memory, file size and open-file limits, the
// lease key hidden), with a clean environment, in a directory beneath the roots; killed
// with its whole process group at its deadline; its stdout and stderr kept up to a cap each
// (the rest read and dropped, `truncated` said).
#include "packs.hpp"

#include <machina/child_process.hpp>
#include <machina/clock.hpp>
#include <machina/executable_file.hpp>
#include <machina/isolation/sandbox_exec.hpp>
#include <machina/workspace.hpp>

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace machina::packs {
namespace {

using json = nlohmann::json;

constexpr std::size_t kMaxArgs = 1024;
constexpr std::size_t kMaxArgBytes = 256 * 1024;
// Where a system keeps its programs, besides the policy's path.
constexpr const char* kProgramDirs[] = {"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"};

bool is_name(const std::string& s) {
  if (s.empty() || s.size() > 255 || s == "." || s == "..") return false;
  return std::all_of(s.begin(), s.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-' || ch == '+';
  });
}

std::string base_name(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

/// Whether `list` names the command (by its name, or by an absolute path).
bool listed(const std::vector<std::string>& list, const std::string& name, const std::string& resolved) {
  for (const auto& entry : list) {
    if (entry.front() == '/' ? entry == resolved : (entry == name || entry == base_name(resolved))) return true;
  }
  return false;
}

/// Each file a list names (a name as found in `dirs`, an absolute path as it is), calling
/// `take(path, name, real)` with its real path.
template <typename Take>
void each_listed_file(const std::vector<std::string>& list, const std::vector<std::string>& dirs, Take take) {
  auto found = [&](const std::string& path, const std::string& name) {
    if (!executable_file(path)) return;
    std::error_code ec;
    const std::string real = std::filesystem::canonical(path, ec).string();
    if (!ec) take(path, name, real);
  };
  for (const auto& entry : list) {
    if (entry.front() == '/') {
      found(entry, base_name(entry));
      continue;
    }
    for (const auto& dir : dirs) found(dir + "/" + entry, entry);
  }
}

/// The files a command may execute, whatever executes them (the launcher, or a program it
/// runs: env, nice, sh): the allowed programs' files, but those the deny list names by any
/// of their names (a link, or a multi-call program: pkill is pgrep), then the dynamic
/// loaders they need.
std::vector<std::string> allowed_programs(const ShellPolicy& policy) {
  // A denied name is looked for in the system's program folders too (a command may name
  // a program by its absolute path).
  std::vector<std::string> dirs = policy.path;
  for (const char* dir : kProgramDirs) dirs.emplace_back(dir);
  std::vector<std::string> denied_files;
  each_listed_file(policy.deny, dirs, [&](const std::string&, const std::string&, const std::string& real) {
    denied_files.push_back(real);
  });
  std::vector<std::string> out;
  each_listed_file(
      policy.allow, policy.path, [&](const std::string& path, const std::string& name, const std::string& real) {
        const bool denied = listed(policy.deny, name, path) || listed(policy.deny, base_name(real), real) ||
                            std::find(denied_files.begin(), denied_files.end(), real) != denied_files.end();
        if (!denied && std::find(out.begin(), out.end(), real) == out.end()) out.push_back(real);
      });
  const std::size_t programs = out.size();
  for (std::size_t i = 0; i < programs; ++i) {
    const std::string loader = sandbox::elf_interpreter(out[i]);
    if (!loader.empty() && std::find(out.begin(), out.end(), loader) == out.end()) out.push_back(loader);
  }
  return out;
}

/// The interpreter a script names on its "#!" line, as a real path; "" for none.
std::string script_interpreter(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  char head[256] = {};
  const ssize_t n = ::read(fd, head, sizeof head - 1);
  ::close(fd);
  if (n < 3 || head[0] != '#' || head[1] != '!') return {};
  std::string line(head + 2, static_cast<std::size_t>(n) - 2);
  line = line.substr(0, line.find('\n'));
  const auto start = line.find_first_not_of(" \t");
  if (start == std::string::npos) return {};
  const std::string interpreter = line.substr(start, line.find_first_of(" \t", start) - start);
  std::error_code ec;
  const auto real = std::filesystem::canonical(interpreter, ec);
  return ec ? interpreter : real.string();
}

/// Reads what is there without blocking; keeps up to `cap` bytes. False at end of file.
bool drain(int fd, std::string& kept, std::size_t cap, bool& truncated) {
  char buf[16384];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      const std::size_t room = cap > kept.size() ? cap - kept.size() : 0;
      kept.append(buf, std::min(room, static_cast<std::size_t>(n)));
      if (static_cast<std::size_t>(n) > room) truncated = true;
      continue;
    }
    if (n == 0) return false;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
}

}  // namespace

Result shell_exec(const Call& c) {
  const ShellPolicy& policy = c.policy.shell;
  const std::string command = c.input.at("command").get<std::string>();
  std::vector<std::string> args;
  if (auto it = c.input.find("args"); it != c.input.end()) args = it->get<std::vector<std::string>>();
  std::size_t arg_bytes = 0;
  for (const auto& a : args) {
    if (a.find('\0') != std::string::npos) return invalid("an argument contains a NUL character");
    arg_bytes += a.size() + 1;
  }
  if (args.size() > kMaxArgs || arg_bytes > kMaxArgBytes) {
    return invalid("at most " + std::to_string(kMaxArgs) + " arguments of " + std::to_string(kMaxArgBytes) +
                   " bytes in all");
  }
  const bool absolute = !command.empty() && command.front() == '/';
  if (!absolute && !is_name(command)) {
    return invalid("command " + excerpt(command) +
                   " is not a program's name or absolute path (no shell runs here: give the program in 'command' "
                   "and each argument in 'args')");
  }
  const std::string name = base_name(command);
  const std::string refused = "Command '" + excerpt(name) + "' is not allowed by security policy";
  if (listed(policy.deny, name, command)) return denied(refused);
  // Where the program is: the absolute path given, else the first in the policy's path.
  std::string program;
  if (absolute) {
    if (command.find("/../") != std::string::npos || command.ends_with("/..")) return denied(refused);
    if (executable_file(command)) program = command;
  } else {
    for (const auto& dir : policy.path) {
      if (executable_file(dir + "/" + command)) {
        program = dir + "/" + command;
        break;
      }
    }
  }
  if (program.empty()) {
    if (!listed(policy.allow, name, command)) return denied(refused);
    std::string where;
    for (const auto& d : policy.path) where += (where.empty() ? "" : ":") + d;
    return missing("command " + excerpt(command) + " not found" + (absolute ? "" : " in " + where));
  }
  std::error_code ec;
  const std::string real = std::filesystem::canonical(program, ec).string();
  if (ec) return missing("command " + excerpt(command) + ": " + ec.message());
  // Both the name called and the file it is (a link's target) must pass.
  if (listed(policy.deny, base_name(real), real)) return denied(refused);
  if (!listed(policy.allow, name, program) && !listed(policy.allow, base_name(real), real)) {
    return denied(refused + (policy.allow.empty() ? " (the policy allows no command)" : ""));
  }
  // What the command may execute: the allowed programs alone, whatever starts them.
  std::vector<std::string> executable = allowed_programs(policy);
  if (std::find(executable.begin(), executable.end(), real) == executable.end()) {
    executable.push_back(real);
    if (auto loader = sandbox::elf_interpreter(real); !loader.empty()) executable.push_back(loader);
  }
  if (const std::string interpreter = script_interpreter(real);
      !interpreter.empty() && std::find(executable.begin(), executable.end(), interpreter) == executable.end()) {
    return denied(refused + " (it is a script run by " + excerpt(interpreter) +
                  ", which the allow list does not name)");
  }

  // The working directory: beneath the caller's roots (default: the first root).
  std::string why;
  const std::vector<std::string>* roots = c.policy.roots_for(c.user, why);
  if (roots == nullptr) return denied(why);
  std::string cwd = roots->front();
  if (auto it = c.input.find("cwd"); it != c.input.end() && !it->get_ref<const std::string&>().empty()) {
    const std::string& asked = it->get_ref<const std::string&>();
    Target t;
    Result refusal;
    if (!resolve_path(c, asked, true, t, refusal)) return refusal;
    workspace::Workspace ws;
    if (!ws.open(*t.root, why)) return system_error(why);
    if (!ws.open_dir(t.parts, why)) return open_failed(asked, why);
    cwd = *t.root;
    for (const auto& p : t.parts) cwd += "/" + p;
  }

  // The walls.
  const sandbox::Support& support = sandbox::support();
  if (!support.namespaces) return system_error("commands cannot be confined here: " + support.namespaces_why);
  if (c.executable.empty())
    return system_error("commands cannot be confined: the machina-toolhost launcher is unknown");
  sandbox::ExecSpec walls;
  walls.own_network = walls.no_sockets = !policy.network;
  walls.no_processes = !policy.subprocesses;
  walls.memory_mb = policy.memory_mb;
  walls.cpu_seconds = policy.cpu_seconds;
  walls.file_size_mb = policy.file_size_mb;
  walls.open_files = policy.open_files;
  if (support.landlock_abi < 1) {
    return system_error(
        "commands cannot be confined here: writing only beneath the roots needs Landlock, which "
        "this kernel does not offer (or MACHINA_TOOLHOST_NO_LANDLOCK=1 turned it off)");
  }
  {
    walls.restrict_write = true;
    walls.write_paths = *roots;
    walls.restrict_read = true;
    walls.read_paths = policy.read_paths;
    walls.restrict_exec = true;
    walls.exec_paths = std::move(executable);
    // The folders programs are found in lose exec, but for the allowed programs: the dynamic
    // loader, which the command may execute, cannot map another program from there.
    std::vector<std::string> program_dirs = policy.path;
    for (const char* dir : kProgramDirs) program_dirs.emplace_back(dir);
    for (const auto& dir : program_dirs) {
      std::error_code dir_ec;
      const std::string real_dir = std::filesystem::canonical(dir, dir_ec).string();
      if (!dir_ec &&
          std::find(walls.no_exec_paths.begin(), walls.no_exec_paths.end(), real_dir) == walls.no_exec_paths.end())
        walls.no_exec_paths.push_back(real_dir);
    }
  }
  // What the file tools refuse by name, the command does not see either.
  for (const auto& root : *roots) {
    if (!denied_beneath(c.policy, root, policy.max_scanned_entries, walls.hidden_files)) {
      return system_error("more than " + std::to_string(policy.max_scanned_entries) + " names beneath " + root +
                          " to look through for denied ones (narrow the roots, or raise [shell] max_scanned_entries)");
    }
  }
  if (const char* key = std::getenv("MACHINA_LEASE_KEY_FILE"); key != nullptr && *key != '\0') {
    walls.hidden_files.emplace_back(key);
  }

  ChildSpec child;
  child.executable = c.executable;
  child.argv = {c.executable, "--sandbox-exec", walls.to_json(), "--", program};
  child.argv.insert(child.argv.end(), args.begin(), args.end());
  std::string path_var;
  for (const auto& d : policy.path) path_var += (path_var.empty() ? "" : ":") + d;
  child.env = {"PATH=" + path_var, "HOME=" + cwd, "LANG=C.UTF-8", "LC_ALL=C.UTF-8", "TERM=dumb"};
  child.stdio = ChildSpec::Stdio::pipes;
  child.cwd = cwd;
  child.tail_bytes = 1;

  const std::int64_t started = steady_now_ms();
  const std::int64_t deadline = std::min(c.spec.deadline_ms, started + policy.timeout_ms);
  std::unique_ptr<ChildProcess> proc;
  try {
    proc = std::make_unique<ChildProcess>(child, c.spawner);
  } catch (const ConfigError& e) {
    return system_error(std::string("cannot start ") + excerpt(command) + ": " + e.what());
  }
  proc->close_input();
  if (c.spec.cancel != nullptr) c.spec.cancel->on_cancel([p = proc.get()] { p->kill(); });
  std::string out, err;
  bool out_cut = false, err_cut = false, out_open = true, err_open = true, timed_out = false;
  const std::size_t cap = policy.max_output_bytes;
  while (out_open || err_open) {
    const std::int64_t left = deadline - steady_now_ms();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd fds[2] = {{out_open ? proc->stdout_fd() : -1, POLLIN, 0}, {err_open ? proc->output_fd() : -1, POLLIN, 0}};
    const int n = ::poll(fds, 2, static_cast<int>(std::min<std::int64_t>(left, 1000)));
    if (n < 0 && errno != EINTR) break;
    if (out_open && fds[0].revents != 0) out_open = drain(proc->stdout_fd(), out, cap, out_cut);
    if (err_open && fds[1].revents != 0) err_open = drain(proc->output_fd(), err, cap, err_cut);
  }
  // Its streams are closed; the program itself may still be running (it closed them).
  while (!timed_out &&
         !proc->wait_exit(std::chrono::milliseconds(std::clamp<std::int64_t>(deadline - steady_now_ms(), 0, 100)))) {
    if (steady_now_ms() >= deadline) timed_out = true;
  }
  if (c.spec.cancel != nullptr) c.spec.cancel->on_cancel(nullptr);
  const bool cancelled = c.spec.cancel != nullptr && c.spec.cancel->cancelled();
  proc->end(50);
  const int code = proc->exit_code();
  if (cancelled) return Result::stopped(RunOutcome::Ending::cancelled);
  if (timed_out) {
    return Result::stopped(RunOutcome::Ending::timed_out, "command " + excerpt(command) + " ran past " +
                                                              std::to_string(deadline - started) +
                                                              " ms; its process group was killed");
  }
  if (code == 126 && err.find("machina-toolhost") != std::string::npos) {
    return system_error("command " + excerpt(command) + " could not be confined: " + err.substr(0, 500));
  }
  json o{{"stdout", json(out).dump(-1, ' ', false, json::error_handler_t::replace)},
         {"stderr", json(err).dump(-1, ' ', false, json::error_handler_t::replace)}};
  // Text that is not UTF-8 is shown with replacement characters.
  o["stdout"] = json::parse(o["stdout"].get<std::string>());
  o["stderr"] = json::parse(o["stderr"].get<std::string>());
  o["exit_code"] = code;
  if (c.shape == Shape::detailed) {
    o["truncated"] = out_cut || err_cut;
    o["stdout_truncated"] = out_cut;
    o["stderr_truncated"] = err_cut;
    o["duration_ms"] = steady_now_ms() - started;
    if (code == sandbox::kMemoryCapStatus) o["killed"] = "memory limit of " + std::to_string(policy.memory_mb) + " MB";
  } else {
    o["truncated"] = out_cut || err_cut;
  }
  return Result::ok(std::move(o));
}

}  // namespace machina::packs
