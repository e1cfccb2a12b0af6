// See hosted_server.hpp: a hosted server's start, with its handshake (MCP: server/discover
// or initialize, then tools/list page by page; a skill: initialize, then skill/load and
// skill/activate or lifecycle/onLoad), and its start again after it ended, with back-off.
#include "hosted_server_protocol.hpp"
#include "remote_tool_output.hpp"

#include <machina/clock.hpp>
#include <machina/errors.hpp>
#include <machina/runners/hosted_server.hpp>

#include <algorithm>

namespace machina {
namespace {

using json = nlohmann::json;

constexpr std::size_t kMaxTools = 10'000;
constexpr int kMaxPages = 1'000;
constexpr std::int64_t kMaxBackoffMs = 30'000;

/// Before the nth start in a row that follows a failure: none for the first, then 100 ms,
/// doubling, at most 30 s.
std::int64_t backoff_ms(int failures) {
  if (failures <= 1) return 0;
  return std::min<std::int64_t>(kMaxBackoffMs, std::int64_t{100} << std::min(failures - 2, 20));
}

}  // namespace

std::shared_ptr<RpcChild> HostedServer::launch(std::int64_t deadline_ms, std::vector<RemoteTool>* tools,
                                               std::string& why, bool& modern) {
  modern = false;
  std::shared_ptr<RpcChild> child;
  try {
    child = std::make_shared<RpcChild>(
        options_.child, [this](const jsonrpc::Message& m, std::string& reply) { on_request(m, reply); },
        [this](const jsonrpc::Message& m) { on_notification(m); }, &spawner_);
  } catch (const ConfigError& e) {
    why = std::string("cannot start it: ") + e.what();
    return nullptr;
  }
  auto failed = [&](const std::string& step, const RpcChild::Reply& r) {
    std::string what = r.message;
    if (r.ending == RpcChild::Reply::Ending::error) what = "error " + std::to_string(r.code) + ": " + r.message;
    if (r.ending == RpcChild::Reply::Ending::timed_out)
      what = "no answer within " + std::to_string(options_.start_timeout_ms) + " ms";
    why = step + " failed: " + what;
    std::string tail = child->tail();
    while (!tail.empty() && (tail.back() == '\n' || tail.back() == ' ')) tail.pop_back();
    if (!tail.empty() && why.find(tail) == std::string::npos) why += "; stderr: " + tail;
    child->kill(why);
    return nullptr;
  };
  auto add_tools = [&](const json& list, bool mcp) -> bool {
    if (!list.is_array()) return false;
    for (const auto& t : list) {
      if (!t.is_object() || !t.contains("name") || !t["name"].is_string() || t["name"].get<std::string>().empty())
        return false;
      if (tools != nullptr && tools->size() < kMaxTools) tools->push_back(remote_output::remote_tool_of(t, mcp));
    }
    return true;
  };
  // One page of tools/list (its params text): false, the child killed, when it fails.
  auto list_tools = [&](const std::string& params, json& list) -> bool {
    const auto r = child->call("tools/list", params, deadline_ms);
    if (r.ending != RpcChild::Reply::Ending::result) {
      failed("tools/list", r);
      return false;
    }
    list = json::parse(r.result, nullptr, false);
    if (!list.is_object() || !add_tools(list.value("tools", json()), true)) {
      why = "tools/list failed: its answer is not a list of tools";
      child->kill(why);
      return false;
    }
    return true;
  };
  using Dialect = HostedServerOptions::Dialect;
  if (options_.dialect == Dialect::mcp) {
    using Ending = RpcChild::Reply::Ending;
    // Any answer but a result listing 2026-07-28 (an error, a time-out) means the handshake.
    const std::int64_t now = steady_now_ms();
    auto r = child->call("server/discover", "{\"_meta\":{" + kEnvelope + "}}",
                         now + std::min(kDiscoverTimeoutMs, std::max<std::int64_t>(0, deadline_ms - now) / 2));
    if (r.ending == Ending::crashed || r.ending == Ending::closed) return failed("server/discover", r);
    if (r.ending == Ending::result) {
      const auto discovered = json::parse(r.result, nullptr, false);
      modern = discovered.is_object() && lists_modern(discovered.value("supportedVersions", json()));
    }
    if (!modern) {
      const json init = {{"protocolVersion", "2025-11-25"},
                         {"capabilities", json::object()},
                         {"clientInfo", {{"name", "machina-toolhost"}, {"version", MACHINA_VERSION}}}};
      r = child->call("initialize", init.dump(), deadline_ms);
      // (A server whose answer to a timed-out probe came too late has chosen 2026-07-28 and
      // names it in its refusal of the handshake.)
      if (r.ending == Ending::error && r.code == kUnsupportedProtocolVersion) {
        const auto data = json::parse(r.data.empty() ? std::string_view("null") : r.data, nullptr, false);
        modern = data.is_object() && lists_modern(data.value("supported", json()));
      }
    }
    if (!modern) {
      if (r.ending != Ending::result) return failed("initialize", r);
      const auto result = json::parse(r.result, nullptr, false);
      if (!result.is_object() || !result.contains("protocolVersion") || !result["protocolVersion"].is_string()) {
        why = "initialize failed: its answer names no protocolVersion";
        child->kill(why);
        return nullptr;
      }
      child->notify("notifications/initialized", "");
    }
    std::string cursor;
    for (int page = 0; page < kMaxPages; ++page) {
      json params = cursor.empty() ? json::object() : json{{"cursor", cursor}};
      std::string text = params.dump();
      if (modern) {
        text.pop_back();  // (the closing brace)
        text += std::string(text.size() > 1 ? "," : "") + "\"_meta\":{" + kEnvelope + "}}";
      }
      json list;
      if (!list_tools(text, list)) return nullptr;
      if (!list.contains("nextCursor") || !list["nextCursor"].is_string()) break;
      cursor = list["nextCursor"].get<std::string>();
    }
    return child;
  }
  // Skills: initialize says what it has; then it is loaded.
  auto r = child->call("initialize", "{}", deadline_ms);
  if (r.ending != RpcChild::Reply::Ending::result) return failed("initialize", r);
  const auto result = json::parse(r.result, nullptr, false);
  if (!result.is_object()) {
    why = "initialize failed: its answer is not an object";
    child->kill(why);
    return nullptr;
  }
  if (result.contains("tools")) {
    if (!add_tools(result["tools"], false)) {
      why = "initialize failed: its tools are not a list of named tools";
      child->kill(why);
      return nullptr;
    }
  } else if (options_.dialect == Dialect::runtime_skill) {
    json list;
    if (!list_tools("{}", list)) return nullptr;
  }
  if (options_.dialect == Dialect::runtime_skill) {
    json manifest =
        json::parse(options_.skill_manifest_json.empty() ? "{}" : options_.skill_manifest_json, nullptr, false);
    r = child->call("skill/load", json{{"manifest", manifest}, {"dataDir", options_.data_dir}}.dump(), deadline_ms);
    if (r.ending != RpcChild::Reply::Ending::result) return failed("skill/load", r);
    r = child->call("skill/activate", "{}", deadline_ms);
    if (r.ending != RpcChild::Reply::Ending::result) return failed("skill/activate", r);
  } else {
    r = child->call("lifecycle/onLoad", "{}", deadline_ms);
    if (r.ending != RpcChild::Reply::Ending::result && r.ending != RpcChild::Reply::Ending::error)
      return failed("lifecycle/onLoad", r);
  }
  return child;
}

std::vector<RemoteTool> HostedServer::start() {
  std::lock_guard start_lock(start_mu_);
  std::vector<RemoteTool> tools;
  std::string why;
  bool modern = false;
  auto child = launch(steady_now_ms() + options_.start_timeout_ms, &tools, why, modern);
  if (!child) throw ConfigError(why);
  std::lock_guard lock(mu_);
  child_ = std::move(child);
  child_modern_ = modern;
  return tools;
}

std::shared_ptr<RpcChild> HostedServer::live_child(std::int64_t deadline_ms, std::string& why) {
  {
    std::lock_guard lock(mu_);
    if (closed_) {
      why = "it was closed";
      return nullptr;
    }
    if (child_ && child_->alive()) return child_;
    if (child_) {
      last_end_ = child_->ended_how();
      child_.reset();
      ++failures_;
      next_start_ms_ = steady_now_ms() + backoff_ms(failures_);
    }
    if (steady_now_ms() < next_start_ms_) {
      why = "it ended (" + last_end_ + ") and is started again in " + std::to_string(next_start_ms_ - steady_now_ms()) +
            " ms";
      return nullptr;
    }
  }
  std::lock_guard start_lock(start_mu_);
  {
    std::lock_guard lock(mu_);
    if (child_ && child_->alive()) return child_;  // another call started it meanwhile
  }
  bool modern = false;
  auto child = launch(std::min(deadline_ms, steady_now_ms() + options_.start_timeout_ms), nullptr, why, modern);
  std::vector<std::string> sessions;
  {
    std::lock_guard lock(mu_);
    if (!child) {
      ++failures_;
      last_end_ = why;
      next_start_ms_ = steady_now_ms() + backoff_ms(failures_ + 1);
      why = "it could not be started again: " + why;
      return nullptr;
    }
    if (options_.on_event) {
      options_.on_event(std::string(kind()) + " " + options_.name + " started again (" + last_end_ + ")");
    }
    child_ = child;
    child_modern_ = modern;
    sessions.assign(sessions_.begin(), sessions_.end());
  }
  // A skill started again is told of the sessions under way, as the one before it was.
  for (const auto& id : sessions)
    lifecycle_on(child, "lifecycle/onSessionStart", "skill/sessionStart", session_params(id));
  return child;
}

}  // namespace machina
