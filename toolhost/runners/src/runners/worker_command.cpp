// See process_runner.hpp: the command line that starts an isolation worker (its plugins,
// limits, hidden files, spare call processes), its start up to its greeting, and a
// plugin described by a worker started for it alone.
#include "process_worker_link.hpp"

#include <machina/clock.hpp>
#include <machina/errors.hpp>
#include <machina/isolation/worker_flags.hpp>
#include <machina/runners/process_runner.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace machina {

using namespace worker_link;

std::unique_ptr<ProcessRunner::Worker> ProcessRunner::start_worker(const std::vector<std::string>& plugins,
                                                                   const std::vector<std::string>* expected,
                                                                   std::int64_t deadline_ms, std::string& why) {
  int sv[2] = {-1, -1};
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    why = std::string("cannot create a socket pair: ") + std::strerror(errno);
    return nullptr;
  }
  auto w = std::make_unique<Worker>();
  w->control = sv[0];
  ChildSpec spec;
  spec.executable = options_.executable;
  namespace flag = worker_flags;
  const auto arg = [](std::string_view f) { return std::string(f); };
  spec.argv = {options_.executable,         arg(flag::kWorker),
               arg(flag::kParentPid),       std::to_string(getpid()),
               arg(flag::kMaxOutputBytes),  std::to_string(options_.max_output_bytes),
               arg(flag::kMaxRequestBytes), std::to_string(options_.max_request_bytes),
               arg(flag::kSpares),          std::to_string(options_.spares)};
  for (const auto& p : plugins) {
    if (p.empty()) {
      spec.argv.push_back(arg(flag::kLinkedTools));  // the host's own linked tools (it is this program too)
    } else {
      spec.argv.push_back(arg(flag::kPlugin));
      spec.argv.push_back(p);
    }
  }
  const WorkerLimits& l = options_.limits;
  if (l.cpu_seconds) spec.argv.insert(spec.argv.end(), {arg(flag::kLimitCpuS), std::to_string(l.cpu_seconds)});
  if (l.address_space_mb)
    spec.argv.insert(spec.argv.end(), {arg(flag::kLimitMemoryMb), std::to_string(l.address_space_mb)});
  if (l.open_files) spec.argv.insert(spec.argv.end(), {arg(flag::kLimitOpenFiles), std::to_string(l.open_files)});
  if (l.file_size_mb) spec.argv.insert(spec.argv.end(), {arg(flag::kLimitFileSizeMb), std::to_string(l.file_size_mb)});
  if (l.no_network) spec.argv.push_back(arg(flag::kNoNetwork));
  for (const auto& f : options_.hidden_files) spec.argv.insert(spec.argv.end(), {arg(flag::kHide), f});
  spec.env = env_;
  spec.fds = {{sv[1], 3}};
  spec.tail_bytes = options_.stderr_tail_bytes;
  try {
    w->process = std::make_unique<ChildProcess>(spec, &spawner_);
  } catch (const ConfigError& e) {
    ::close(sv[1]);
    why = e.what();
    return nullptr;
  }
  ::close(sv[1]);

  // The worker's greeting: the tools it registered (for the pool's workers: the host's).
  const std::int64_t start_deadline = std::min(deadline_ms, steady_now_ms() + options_.start_timeout_ms);
  std::string fail;
  Pump p = Pump::more;
  while (!w->greeted && p == Pump::more) {
    p = pump(*w, expected, start_deadline, fail);
    if (p == Pump::timed_out) fail = "did not start within " + std::to_string(options_.start_timeout_ms) + " ms";
    if (p == Pump::ended) fail = "ended before it was ready";
  }
  if (w->greeted) return w;
  why = "worker process " + fail + "; it " + end_worker(*w, p == Pump::ended);
  if (const std::string tail = w->process->tail(); !tail.empty()) why += "; its last stderr: " + tail;
  return nullptr;
}

std::vector<ToolInfo> ProcessRunner::describe(const std::string& plugin) {
  {
    std::lock_guard lock(mu_);
    if (started_)
      throw ConfigError("plugin " + plugin + ": cannot load a plugin after the isolated workers have started");
  }
  std::string why;
  auto w = start_worker({plugin}, nullptr, steady_now_ms() + options_.start_timeout_ms, why);
  if (!w) {
    // The worker's own words when it said why (e.g. "plugin P: cannot load: ..."), as an
    // inline host would have said them: its line, whatever the process printed after it
    // on its way out (a sanitizer's report, say).
    constexpr std::string_view kSaid = "machina-toolhost worker: ";
    if (const auto at = why.rfind(kSaid); at != std::string::npos) {
      std::string said = why.substr(at + kSaid.size());
      said.resize(std::min(said.size(), said.find('\n')));
      if (!said.empty()) throw ConfigError(said.starts_with("plugin ") ? said : "plugin " + plugin + ": " + said);
    }
    throw ConfigError("plugin " + plugin + ": " + why);
  }
  std::vector<ToolInfo> tools = std::move(w->tools);
  std::lock_guard lock(mu_);
  plugins_.push_back(plugin);
  for (const auto& t : tools) aids_.push_back(t.aid);
  return tools;
}

}  // namespace machina
