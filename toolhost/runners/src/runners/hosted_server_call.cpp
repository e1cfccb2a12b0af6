// See hosted_server.hpp: one call of a hosted server's tool (tools/call), its progress
// token and the MCP envelope, what its answer becomes, and the trace of the call.
#include "hosted_server_protocol.hpp"
#include "remote_tool_output.hpp"

#include <machina/clock.hpp>
#include <machina/json_text.hpp>
#include <machina/runners/hosted_server.hpp>

#include <chrono>

namespace machina {

using json = nlohmann::json;
using namespace remote_output;

RunOutcome HostedServer::call(const RunSpec& spec, const std::string& tool) {
  const auto t0 = std::chrono::steady_clock::now();
  RunOutcome out;
  const std::string what = std::string(kind() == "mcp" ? "MCP server " : "skill ") + options_.name;
  int jsonrpc_error = 0;
  auto finish = [&](pid_t pid) {
    write_call_trace(spec.call.trace_json, {.runner = kind(),
                                            .server = options_.name,
                                            .tool = tool,
                                            .trace_id = spec.trace_id,
                                            .timeout_ms = spec.timeout_ms,
                                            .child_pid = pid,
                                            .jsonrpc_error = jsonrpc_error,
                                            .duration_ms = millis_since(t0)});
    return out;
  };
  if (!starts_json_object(spec.input_json)) {
    out.ending = RunOutcome::Ending::failed;
    out.failure = ErrorKind::invalid_input;
    out.detail = "the input of " + what + "'s tool " + tool + " must be a JSON object (its arguments)";
    return finish(0);
  }
  std::string why;
  auto child = live_child(spec.deadline_ms, why);
  if (!child) {
    out.ending = RunOutcome::Ending::crashed;
    out.detail = what + ": " + why;
    return finish(0);
  }
  InFlight flight;
  flight.call = &spec.call;
  flight.progress = spec.progress;
  bool modern = false;
  {
    std::lock_guard lock(mu_);
    modern = child == child_ && child_modern_;
  }
  std::string token;
  std::string params = "{\"name\":";
  append_json_string(params, tool);
  params += ",\"arguments\":";
  params.append(spec.input_json);
  if (spec.progress != nullptr || modern) {
    params += ",\"_meta\":{";
    if (spec.progress != nullptr) {
      std::lock_guard lock(mu_);
      token = "p" + std::to_string(next_token_++);
      by_token_[token] = &flight;
      params += "\"progressToken\":";
      append_json_string(params, token);
      if (modern) params += ',';
    }
    if (modern) params += kEnvelope;
    params += "}";
  }
  params += "}";
  std::int64_t sent_id = 0;
  // Whatever happens in the call (it may throw), the flight, which lives on this stack, is
  // forgotten before it goes.
  struct Forget {
    HostedServer& set;
    const std::int64_t& id;
    const std::string& token;
    ~Forget() {
      std::lock_guard lock(set.mu_);
      set.in_flight_.erase(id);
      if (!token.empty()) set.by_token_.erase(token);
    }
  };
  RpcChild::Reply reply;
  {
    Forget forget{*this, sent_id, token};
    reply = child->call("tools/call", params, spec.deadline_ms, spec.cancel, [&](std::int64_t id) {
      sent_id = id;
      std::lock_guard lock(mu_);
      in_flight_[id] = &flight;
    });
  }
  std::lock_guard call_lock(flight.mu);  // (a state request answered just now is done with it)
  using Ending = RpcChild::Reply::Ending;
  switch (reply.ending) {
    case Ending::result: {
      {
        std::lock_guard lock(mu_);
        failures_ = 0;
      }
      out.ending = RunOutcome::Ending::ran;
      if (modern) {
        // A 2026-07-28 result that is not complete asks the client for more (input_required):
        // this host has no one to ask.
        std::string result_type, ignored;
        jsonrpc::for_each_member(
            reply.result,
            [&](const jsonrpc::Member& m) {
              if (m.key == "resultType" && m.type == jsonrpc::Member::Type::string) result_type = std::string(m.string);
              return true;
            },
            ignored);
        if (!result_type.empty() && result_type != "complete") {
          spec.call.error = "the server answered resultType " + result_type + ", which asks its client for more; " +
                            "this host answers only complete results";
          out.rc = MACHINA_TOOL_ERROR;
          return finish(child->pid());
        }
      }
      out.rc = take_result(reply.result, spec.call);
      return finish(child->pid());
    }
    case Ending::error:
      out.ending = RunOutcome::Ending::ran;
      out.rc = MACHINA_TOOL_ERROR;
      spec.call.error = "error " + std::to_string(reply.code) + ": " + reply.message;
      jsonrpc_error = reply.code;
      return finish(child->pid());
    case Ending::timed_out:
    case Ending::cancelled: {
      const bool cancelled = reply.ending == Ending::cancelled;
      if (sent_id != 0) {
        const json note = {{"requestId", sent_id}, {"reason", cancelled ? "cancelled by its caller" : "timed out"}};
        child->notify("notifications/cancelled", note.dump());
      }
      if (!cancelled) {
        std::lock_guard lock(mu_);
        to_probe_.push_back(child);  // a child that answers nothing more is hung: a ping says
        wake_.notify_all();
      }
      out.ending = cancelled ? RunOutcome::Ending::cancelled : RunOutcome::Ending::timed_out;
      out.detail = cancelled ? "" : what + " was told notifications/cancelled";
      return finish(child->pid());
    }
    case Ending::crashed:
      out.ending = RunOutcome::Ending::crashed;
      out.detail = what + " " + reply.message;
      return finish(child->pid());
    case Ending::closed: out.ending = RunOutcome::Ending::closed; return finish(0);
  }
  return finish(0);
}

}  // namespace machina
