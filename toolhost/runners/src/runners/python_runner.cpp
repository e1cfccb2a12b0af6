// See python_runner.hpp.
#include <machina/clock.hpp>
#include <machina/errors.hpp>
#include <machina/runners/python_runner.hpp>
#include <machina/tool.hpp>
#include <machina/tool_protocol.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>

namespace machina {
namespace {

using Clock = std::chrono::steady_clock;

/// The `trace` of a call: what the worker reported (what the tool printed, its interpreter)
/// and what the host knows (runner, source, deadline, duration, enforcement).
std::string make_trace(const PythonRunner::ToolFields& f, PythonWorkerPool& pool, std::string_view worker_trace,
                       const std::string& trace_id, std::int64_t timeout_ms, double duration_ms, pid_t pid,
                       const tool_protocol::Answer* answer) {
  nlohmann::ordered_json t = call_trace_head("local", f.source, f.name, f.entry, timeout_ms);
  t["duration_ms"] = duration_ms;
  t["python_path"] = pool.options().python;
  t["python_env"] = nullptr;
  t["sandbox"] = f.sandbox;
  t["trace_id"] = trace_id;
  if (pid > 0) t["worker_pid"] = pid;
  if (!worker_trace.empty()) {
    const auto w = nlohmann::ordered_json::parse(worker_trace, nullptr, /*allow_exceptions=*/false);
    if (w.is_object()) {
      for (const auto& [k, v] : w.items()) {
        if (k == "duration_ms")
          t["tool_duration_ms"] = v;
        else if (k == "python_path" || k == "python_env" || k == "stdout" || k == "stderr" || k == "output_truncated" ||
                 k == "module_reloaded")
          t[k] = v;
      }
    }
  }
  if (auto& env = t["python_env"]; env.is_null())
    env = pool.python_env();  // (no word from the worker)
  else if (env.is_string())
    pool.reported_python_env(env.get_ref<const std::string&>());
  if (!f.enforcement_json.empty()) {
    const auto e = nlohmann::ordered_json::parse(f.enforcement_json, nullptr, false);
    if (e.is_object()) {
      t["enforcement_level"] = e.empty() ? "none" : "enforced";
      t["enforcement"] = e;
    }
  } else {
    t["enforcement_level"] = "none";
  }
  if (!f.refusal.empty()) {
    t["enforcement_level"] = "not_enforceable";
    t["reason_code"] = "guarantee_blocked";
  }
  if (answer != nullptr) write_answer_error(*answer, t);
  return t.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace

// --- the runner -------------------------------------------------------------------------

PythonRunner::PythonRunner(std::shared_ptr<PythonWorkerPool> pool, ToolFields fields)
    : pool_(std::move(pool)), fields_(std::move(fields)) {}

std::vector<std::string> PythonRunner::enforced_guarantees() const {
  std::vector<std::string> out;
  if (!fields_.refusal.empty() || fields_.enforcement_json.empty()) return out;
  const auto how = nlohmann::json::parse(fields_.enforcement_json, nullptr, false);
  if (!how.is_object()) return out;
  for (const auto& [name, _] : how.items()) {
    if (name == "sandbox") {
      for (const char* g : {"no_network", "no_subprocess", "no_filesystem_write"}) out.emplace_back(g);
    } else {
      out.push_back(name);
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

RunOutcome PythonRunner::run(const RunSpec& spec) {
  const auto t0 = Clock::now();
  const std::string trace_id = spec.trace_id.empty() ? tool_protocol::new_trace_id() : std::string(spec.trace_id);
  RunOutcome out;
  auto finish = [&](std::string_view worker_trace, pid_t pid, const tool_protocol::Answer* answer) {
    spec.call.trace_json =
        make_trace(fields_, *pool_, worker_trace, trace_id, spec.timeout_ms, millis_since(t0), pid, answer);
    return out;
  };
  if (!fields_.refusal.empty()) {
    out.ending = RunOutcome::Ending::failed;
    out.failure = ErrorKind::guarantee_blocked;
    out.detail = "guarantee_blocked: " + fields_.refusal;
    return finish({}, 0, nullptr);
  }

  std::string line;
  line.reserve(spec.input_json.size() + 256);
  tool_protocol::encode_local_call({fields_.name, fields_.entry, spec.input_json, fields_.sandbox, trace_id,
                                    fields_.capability_context_json, spec.deadline_ms},
                                   line);
  line.push_back('\n');
  PythonWorkerPool::Exchange ex = pool_->call(line, spec.deadline_ms, spec.cancel, nullptr, 0, spec.user);
  switch (ex.ending) {
    case PythonWorkerPool::Exchange::Ending::timed_out: out.ending = RunOutcome::Ending::timed_out; break;
    case PythonWorkerPool::Exchange::Ending::crashed: out.ending = RunOutcome::Ending::crashed; break;
    case PythonWorkerPool::Exchange::Ending::closed: out.ending = RunOutcome::Ending::closed; break;
    case PythonWorkerPool::Exchange::Ending::cancelled: out.ending = RunOutcome::Ending::cancelled; break;
    case PythonWorkerPool::Exchange::Ending::answered: break;
  }
  if (ex.ending != PythonWorkerPool::Exchange::Ending::answered) {
    out.detail = std::move(ex.detail);
    return finish({}, ex.pid, nullptr);
  }
  tool_protocol::Answer answer;
  std::string why;
  if (!tool_protocol::decode_answer(ex.answer, answer, why)) {
    pool_->condemn(ex.pid, "broke tool protocol v1 and was replaced");
    out.ending = RunOutcome::Ending::crashed;
    out.detail =
        "its Python worker " + std::to_string(ex.pid) + " broke tool protocol v1 (" + why + ") and was replaced";
    return finish({}, ex.pid, nullptr);
  }
  out.ending = RunOutcome::Ending::ran;
  out.rc = tool_protocol::apply_answer(answer, spec.call);
  return finish(answer.trace, ex.pid, &answer);
}

}  // namespace machina
