// See container_runner.hpp.
#include <machina/child_process.hpp>
#include <machina/clock.hpp>
#include <machina/json_text.hpp>
#include <machina/random_text.hpp>
#include <machina/runners/container_runner.hpp>
#include <machina/tool_protocol.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>

namespace machina {
namespace {

using Clock = std::chrono::steady_clock;

/// How long removing a container that outlived its call may take, per command.
constexpr std::chrono::milliseconds kRemoveLimit{5'000};
constexpr std::size_t kStderrTailBytes = 4096;

/// What a container wrote, as an error message may quote it.
std::string written_text(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) text.remove_suffix(1);
  return excerpt(to_valid_utf8(text));
}

std::string joined(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

}  // namespace

const std::vector<std::string>& default_container_command() {
  static const std::vector<std::string> command = {"python", "-m", "namel3ss_tools.runner"};
  return command;
}

std::string container_image_problem(const std::string& image) {
  if (image.empty()) return "must not be empty";
  for (unsigned char c : image) {
    if (c <= 0x20 || c == 0x7f) return "must not hold white space or control characters";
  }
  if (image[0] == '-') return "'" + to_valid_utf8(image) + "' starts with '-', which the runtime would take for a flag";
  // Transports that read an image from a path of the host's.
  for (const char* transport : {"oci-archive:", "docker-archive:", "oci:", "dir:", "containers-storage:",
                                "docker-daemon:", "ostree:", "sif:", "tarball:"}) {
    if (image.rfind(transport, 0) == 0) {
      return "'" + to_valid_utf8(image) + "' names the transport " + transport +
             " (an image read from a host path); name an image the runtime has or pulls";
    }
  }
  return {};
}

std::string container_variable_problem(const std::string& name) {
  const bool ok = !name.empty() && (std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_') &&
                  std::all_of(name.begin(), name.end(),
                              [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
  if (ok) return {};
  std::string shown = to_valid_utf8(name);
  for (char& c : shown) {
    if (static_cast<unsigned char>(c) < 0x20) c = '?';  // (a NUL would end the message where it is printed)
  }
  return "'" + shown + "' is not a variable name (letters, digits and _)";
}

ContainerInvocation container_invocation(const ContainerToolFields& f, const std::string& name,
                                         std::int64_t timeout_s) {
  ContainerInvocation inv;
  auto& a = inv.argv;
  a = {f.runtime_name, "run", "--rm", "-i", "--name", name, "--cap-drop", "all", "--security-opt", "no-new-privileges"};
  if (timeout_s > 0 && f.runtime_name == "podman") a.insert(a.end(), {"--timeout", std::to_string(timeout_s)});
  // Nothing of the host enters: no folder is mounted, no variable passed but its secrets.
  inv.enforced["no_filesystem_read"] = "no host folder is mounted";
  if (f.pass_env.empty()) inv.enforced["no_env_read"] = "no host variable is passed";
  inv.enforced["no_env_write"] = "the container's environment is its own";
  auto required = [&](const char* g) {
    auto it = f.guarantees.find(g);
    return it != f.guarantees.end() && it->second;
  };
  if (required("no_network")) {
    a.insert(a.end(), {"--network", "none"});
    inv.enforced["no_network"] = "no network but loopback (network none)";
  }
  if (required("no_filesystem_write")) {
    // No IPC namespace of the host's and no /dev/shm either (a writable tmpfs otherwise);
    // podman also mounts writable tmpfs folders on a read-only root unless told not to.
    a.insert(a.end(), {"--read-only", "--ipc", "none"});
    if (f.runtime_name == "podman") a.push_back("--read-only-tmpfs=false");
    inv.enforced["no_filesystem_write"] = "a read-only root, no writable folder";
  }
  if (required("no_subprocess")) {
    a.insert(a.end(), {"--pids-limit", "1"});
    inv.enforced["no_subprocess"] = "one process at most (pids limit 1)";
  }
  if (f.memory_mb != 0) a.insert(a.end(), {"--memory", std::to_string(f.memory_mb) + "m"});
  for (const auto& [key, value] : f.env) a.insert(a.end(), {"--env", key + "=" + value});
  for (const auto& key : f.pass_env) a.insert(a.end(), {"--env", key});  // its value: the host's
  a.push_back(f.image);
  a.insert(a.end(), f.command.begin(), f.command.end());
  return inv;
}

ContainerRunner::ContainerRunner(ContainerToolFields fields) : fields_(std::move(fields)) {}

void ContainerRunner::close() {
  std::set<std::string> running;
  {
    std::lock_guard lock(mu_);
    closed_ = true;
    running = running_;
  }
  for (const auto& name : running) remove_container(name);
}

std::vector<std::string> ContainerRunner::enforced_guarantees() const {
  std::vector<std::string> out;
  for (const auto& [g, how] : container_invocation(fields_, "-").enforced) out.push_back(g);
  return out;
}

void ContainerRunner::remove_container(const std::string& name) const {
  for (const char* verb : {"kill", "rm"}) {
    ChildSpec spec;
    spec.executable = fields_.runtime;
    spec.argv = {fields_.runtime_name, verb};
    if (std::string_view(verb) == "rm") spec.argv.push_back("--force");
    spec.argv.push_back(name);
    spec.inherit_env = true;
    try {
      run_to_completion(spec, {}, kRemoveLimit, 4096);
    } catch (const ConfigError&) {
      return;  // not startable now: nothing more can be done from here
    }
  }
}

RunOutcome ContainerRunner::run(const RunSpec& spec) {
  const auto t0 = Clock::now();
  RunOutcome out;
  const std::string trace_id = spec.trace_id.empty() ? tool_protocol::new_trace_id() : std::string(spec.trace_id);
  const std::string name = "machina-call-" + random_text("0123456789abcdef", 20);
  // The monitor's own limit: the deadline, and a few seconds for the host to remove it first.
  ContainerInvocation inv = container_invocation(fields_, name, (spec.timeout_ms + 999) / 1000 + 5);
  {
    std::lock_guard lock(mu_);
    if (closed_) {
      out.ending = RunOutcome::Ending::closed;
      return out;
    }
    running_.insert(name);
  }
  struct Done {
    ContainerRunner& runner;
    const std::string& name;
    ~Done() {
      std::lock_guard lock(runner.mu_);
      runner.running_.erase(name);
    }
  } done{*this, name};

  bool required = false;
  nlohmann::ordered_json enforcement = nlohmann::ordered_json::object();
  for (const auto& [g, on] : fields_.guarantees) {
    if (!on) continue;
    required = true;
    // (Every guarantee has its flag but no_env_read with secrets passed, which a pack's
    // capabilities never ask together; a lookup, so that run() cannot throw either way.)
    if (auto it = inv.enforced.find(g); it != inv.enforced.end()) enforcement[g] = it->second;
  }
  nlohmann::ordered_json trace =
      call_trace_head("container", fields_.source, fields_.name, fields_.entry, spec.timeout_ms);
  trace["container_runtime"] = fields_.runtime_name;
  trace["image"] = fields_.image;
  trace["command"] = joined(fields_.command);
  trace["container_name"] = name;
  trace["python_env"] = nullptr;  // the image's own: not known to the host
  trace["container_enforcement"] = "verified";
  trace["enforcement_level"] = required ? "enforced" : "none";
  if (required) trace["enforcement"] = enforcement;
  trace["trace_id"] = trace_id;
  auto finish = [&] {
    trace["duration_ms"] = millis_since(t0);
    spec.call.trace_json = trace.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    return out;
  };
  auto fail = [&](RunOutcome::Ending ending, std::string detail) {
    out.ending = ending;
    out.detail = std::move(detail);
    return finish();
  };

  std::string input;
  input.reserve(spec.input_json.size() + 256);
  tool_protocol::encode_local_call({fields_.name, fields_.entry, spec.input_json, false, trace_id, {}}, input);
  input.push_back('\n');
  ChildSpec child;
  child.executable = fields_.runtime;
  child.argv = std::move(inv.argv);
  child.inherit_env = true;  // the runtime's client needs its own settings (its config, its socket)
  child.tail_bytes = kStderrTailBytes;
  const auto limit = std::chrono::milliseconds(std::max<std::int64_t>(1, spec.deadline_ms - steady_now_ms()));
  ChildOutcome ran;
  try {
    ran = run_to_completion(std::move(child), input, limit, fields_.max_answer_bytes);
  } catch (const ConfigError& e) {
    return fail(RunOutcome::Ending::crashed, "cannot start " + fields_.runtime + ": " + e.what());
  }
  trace["exit_code"] = ran.exit_code;
  if (ran.ended == ChildOutcome::Ended::timed_out) {
    remove_container(name);
    return fail(RunOutcome::Ending::timed_out, "the container " + name + " was still running; it was removed");
  }
  if (ran.ended == ChildOutcome::Ended::output_over_cap) {
    remove_container(name);
    out.failure = ErrorKind::output_too_large;
    return fail(RunOutcome::Ending::failed,
                "the container's answer is larger than " + std::to_string(fields_.max_answer_bytes) + " bytes");
  }
  std::string_view answer_text = ran.stdout_text;
  while (!answer_text.empty() && (answer_text.back() == '\n' || answer_text.back() == '\r'))
    answer_text.remove_suffix(1);
  if (answer_text.empty()) {
    remove_container(name);  // the runtime's client ended without an answer: its container may live on
    return fail(RunOutcome::Ending::crashed, fields_.runtime_name + " " + ran.how + " without an answer" +
                                                 (ran.tail.empty() ? "" : ": " + written_text(ran.tail)));
  }
  tool_protocol::Answer answer;
  std::string why;
  if (!tool_protocol::decode_answer(answer_text, answer, why)) {
    return fail(RunOutcome::Ending::crashed,
                "the container's answer is not tool protocol v1: " + why + " (" + written_text(answer_text) + ")");
  }
  out.ending = RunOutcome::Ending::ran;
  out.rc = tool_protocol::apply_answer(answer, spec.call);
  write_answer_error(answer, trace);
  return finish();
}

}  // namespace machina
