// See jsonrpc_runner.hpp.
#include <machina/clock.hpp>
#include <machina/json_text.hpp>
#include <machina/runners/jsonrpc_runner.hpp>
#include <machina/tool_protocol.hpp>

#include <machina/workspace.hpp>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#ifndef MACHINA_VERSION
#define MACHINA_VERSION "dev"
#endif

namespace machina {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kMaxTools = 10'000;
constexpr int kMaxPages = 1'000;
constexpr std::int64_t kMaxBackoffMs = 30'000;
constexpr std::size_t kMaxSessions = 1024;  // sessions under way a skill started again is told of
// MCP 2026-07-28: asked first, with server/discover (as the official SDK's client does in its
// auto mode, with its probe's time limit; here also at most half the time left to start, so
// that a server which leaves the probe unanswered still has time for the handshake); a
// server that does not list it among its versions is spoken to with the initialize handshake.
constexpr const char* kModernVersion = "2026-07-28";
constexpr std::int64_t kDiscoverTimeoutMs = 10'000;
constexpr int kUnsupportedProtocolVersion = -32022;
// The per-request envelope of 2026-07-28: this client's version, name and capabilities (none).
const std::string kEnvelope = std::string(R"("io.modelcontextprotocol/protocolVersion":")") + kModernVersion +
                              R"(","io.modelcontextprotocol/clientInfo":{"name":"machina-toolhost","version":")" +
                              MACHINA_VERSION + R"("},"io.modelcontextprotocol/clientCapabilities":{})";

/// Whether a list of protocol versions (a DiscoverResult's supportedVersions, a -32022
/// error's supported) holds 2026-07-28.
bool lists_modern(const json& versions) {
  if (!versions.is_array()) return false;
  return std::any_of(versions.begin(), versions.end(), [](const json& v) { return v == kModernVersion; });
}

std::string session_params(const std::string& id) { return json{{"sessionId", id}}.dump(); }

/// Before the nth start in a row that follows a failure: none for the first, then 100 ms,
/// doubling, at most 30 s.
std::int64_t backoff_ms(int failures) {
  if (failures <= 1) return 0;
  return std::min<std::int64_t>(kMaxBackoffMs, std::int64_t{100} << std::min(failures - 2, 20));
}

std::string text_of(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

/// The text of a result's content: a string (the seed's form), or the text blocks of a
/// list of content blocks, one after the other.
std::string content_text(const json& content) {
  if (content.is_string()) return content.get<std::string>();
  std::string out;
  if (content.is_array()) {
    for (const auto& block : content) {
      if (block.is_object() && block.value("type", "") == "text" && block.contains("text") && block["text"].is_string()) {
        if (!out.empty()) out += "\n";
        out += block["text"].get<std::string>();
      }
    }
  }
  return out.empty() ? content.dump() : out;
}

/// A tool's output from a tools/call result: structuredContent when there is one; a
/// string content (the seed's) or a single text block as a JSON string; other content as
/// the list of its blocks; a result without content as it is.
std::string output_of(const json& result) {
  if (!result.is_object()) return result.dump();
  if (result.contains("structuredContent") && !result["structuredContent"].is_null())
    return result["structuredContent"].dump();
  if (!result.contains("content")) return result.dump();
  const json& content = result["content"];
  if (content.is_string()) return json(content.get<std::string>()).dump();
  if (content.is_array() && content.size() == 1 && content[0].is_object() && content[0].value("type", "") == "text" &&
      content[0].contains("text") && content[0]["text"].is_string())
    return json(content[0]["text"].get<std::string>()).dump();
  return content.dump();
}

/// output_of() without a DOM, for the results of every shape but an error: the output is a
/// span of the answer's own JSON text (structuredContent, a string content, a single text
/// block's text, the content list). False for an isError result (or one not an object).
bool fast_output(std::string_view result, std::string& output) {
  using jsonrpc::Member;
  std::string_view structured, content;
  Member::Type content_type = Member::Type::null;
  bool error = false;
  std::string why;
  const bool ok = jsonrpc::for_each_member(
      result,
      [&](const Member& m) {
        if (m.key == "structuredContent" && m.type != Member::Type::null) structured = m.raw;
        else if (m.key == "content") content = m.raw, content_type = m.type;
        else if (m.key == "isError" && m.raw == "true") error = true;
        return true;
      },
      why);
  if (!ok || error) return false;
  if (!structured.empty()) {
    output.assign(structured);
  } else if (content.empty()) {
    output.assign(result);
  } else if (content_type == Member::Type::string) {
    output.assign(content);
  } else {
    // A list of one text block: its text (a JSON string as written); any other list as it is.
    std::string_view only, text;
    int count = 0;
    if (content_type == Member::Type::array) {
      jsonrpc::for_each_element(
          content,
          [&](const Member& m) {
            only = m.raw;
            return ++count < 2;
          },
          why);
    }
    if (count == 1 && !only.empty() && only.front() == '{') {
      bool is_text = false;
      jsonrpc::for_each_member(
          only,
          [&](const Member& m) {
            if (m.key == "type") is_text = m.type == Member::Type::string && m.string == "text";
            else if (m.key == "text" && m.type == Member::Type::string) text = m.raw;
            return true;
          },
          why);
      if (!is_text) text = {};
    }
    output.assign(text.empty() ? content : text);
  }
  return true;
}

bool is_object_text(std::string_view text) {
  const auto at = text.find_first_not_of(" \t\r\n");
  return at != std::string_view::npos && text[at] == '{';
}

/// A ds_state slot named as a request of the skill names it: 3, "3" or "DS3".
int slot_of(const json& v) {
  if (v.is_number_integer()) {
    const auto n = v.get<std::int64_t>();
    return n >= 0 && n < static_cast<std::int64_t>(kDsSlots) ? static_cast<int>(n) : -1;
  }
  if (!v.is_string()) return -1;
  std::string s = v.get<std::string>();
  if (s.rfind("DS", 0) == 0) s = s.substr(2);
  if (s.size() != 1 || s[0] < '0' || s[0] >= static_cast<char>('0' + kDsSlots)) return -1;
  return s[0] - '0';
}

json artifact_json(const Artifact& a) {
  return {{"type", a.type}, {"content_json", a.content_json}, {"provenance", a.provenance}, {"size_bytes", a.size_bytes}};
}

std::string default_data_dir(const std::string& name) {
  std::string base;
  if (const char* state = std::getenv("XDG_STATE_HOME"); state != nullptr && *state != '\0') base = state;
  else if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') base = std::string(home) + "/.local/state";
  else base = "/tmp/machina-toolhost-" + std::to_string(getuid());
  std::string safe;
  for (char c : name) safe.push_back(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ? c : '_');
  return base + "/machina-toolhost/skills/" + safe;
}

}  // namespace

std::string remote_aid(const std::string& prefix, const std::string& tool) {
  std::string out = prefix;
  for (char c : tool) {
    out.push_back(std::isalnum(static_cast<unsigned char>(c)) ? static_cast<char>(std::toupper(static_cast<unsigned char>(c)))
                                                               : '_');
  }
  return out + ".v1";
}

std::string default_aid_prefix(const std::string& kind, const std::string& name) {
  std::string out = kind == "mcp_server" || kind == "mcp" ? "AID.MCP." : "AID.SKILL.";
  for (char c : name) {
    out.push_back(std::isalnum(static_cast<unsigned char>(c)) ? static_cast<char>(std::toupper(static_cast<unsigned char>(c)))
                                                               : '_');
  }
  return out + ".";
}

JsonRpcToolRunner::JsonRpcToolRunner(std::shared_ptr<JsonRpcToolset> toolset, std::string tool,
                                     std::string enforcement_json)
    : toolset_(std::move(toolset)), tool_(std::move(tool)) {
  const auto how = json::parse(enforcement_json.empty() ? "{}" : enforcement_json, nullptr, false);
  if (how.is_object()) {
    for (const auto& [name, _] : how.items()) {
      if (name != "sandbox") enforced_.push_back(name);
    }
  }
}

/// A call in flight on the child: what its state/* requests and progress reach.
struct JsonRpcToolset::InFlight {
  CallContext* call = nullptr;
  ProgressSink* progress = nullptr;
  std::mutex mu;  // the call's context, between the thread reading the child and the caller
};

JsonRpcToolset::JsonRpcToolset(JsonRpcToolsetOptions options) : options_(std::move(options)) {
  if (options_.dialect != JsonRpcToolsetOptions::Dialect::mcp) {
    if (options_.data_dir.empty()) options_.data_dir = default_data_dir(options_.name);
    std::error_code ec;
    std::filesystem::create_directories(options_.data_dir, ec);
    if (ec) throw HostError("skill " + options_.name + ": cannot make its data directory " + options_.data_dir + ": " + ec.message());
  }
  background_ = std::thread([this] { background_loop(); });
}

JsonRpcToolset::~JsonRpcToolset() {
  close();
  background_.join();
}

pid_t JsonRpcToolset::pid() const {
  std::lock_guard lock(mu_);
  return child_ && child_->alive() ? child_->pid() : 0;
}

std::shared_ptr<JsonRpcChild> JsonRpcToolset::launch(std::int64_t deadline_ms, std::vector<RemoteTool>* tools,
                                                     std::string& why, bool& modern) {
  modern = false;
  std::shared_ptr<JsonRpcChild> child;
  try {
    child = std::make_shared<JsonRpcChild>(
        options_.child, [this](const jsonrpc::Message& m, std::string& reply) { on_request(m, reply); },
        [this](const jsonrpc::Message& m) { on_notification(m); }, &spawner_);
  } catch (const HostError& e) {
    why = std::string("cannot start it: ") + e.what();
    return nullptr;
  }
  auto failed = [&](const std::string& step, const JsonRpcChild::Reply& r) {
    std::string what = r.message;
    if (r.ending == JsonRpcChild::Reply::Ending::error) what = "error " + std::to_string(r.code) + ": " + r.message;
    if (r.ending == JsonRpcChild::Reply::Ending::timed_out) what = "no answer within " + std::to_string(options_.start_timeout_ms) + " ms";
    why = step + " failed: " + what;
    std::string tail = child->tail();
    while (!tail.empty() && (tail.back() == '\n' || tail.back() == ' ')) tail.pop_back();
    if (!tail.empty() && why.find(tail) == std::string::npos) why += "; stderr: " + tail;
    child->kill(why);
    return nullptr;
  };
  auto tool_of = [](const json& t, bool mcp) -> RemoteTool {
    RemoteTool r;
    r.name = t.value("name", "");
    r.title = t.contains("title") && t["title"].is_string() ? t["title"].get<std::string>() : "";
    r.description = t.contains("description") && t["description"].is_string() ? t["description"].get<std::string>() : "";
    const char* schema_key = mcp ? "inputSchema" : "parameters";
    if (t.contains(schema_key) && t[schema_key].is_object()) r.input_schema = t[schema_key].dump();
    else if (!mcp && t.contains("inputSchema") && t["inputSchema"].is_object()) r.input_schema = t["inputSchema"].dump();
    if (t.contains("outputSchema") && t["outputSchema"].is_object()) r.output_schema = t["outputSchema"].dump();
    if (t.contains("annotations") && t["annotations"].is_object()) r.annotations = t["annotations"].dump();
    return r;
  };
  auto add_tools = [&](const json& list, bool mcp) -> bool {
    if (!list.is_array()) return false;
    for (const auto& t : list) {
      if (!t.is_object() || !t.contains("name") || !t["name"].is_string() || t["name"].get<std::string>().empty())
        return false;
      if (tools != nullptr && tools->size() < kMaxTools) tools->push_back(tool_of(t, mcp));
    }
    return true;
  };
  using Dialect = JsonRpcToolsetOptions::Dialect;
  if (options_.dialect == Dialect::mcp) {
    using Ending = JsonRpcChild::Reply::Ending;
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
      r = child->call("tools/list", text, deadline_ms);
      if (r.ending != JsonRpcChild::Reply::Ending::result) return failed("tools/list", r);
      const auto list = json::parse(r.result, nullptr, false);
      if (!list.is_object() || !add_tools(list.value("tools", json()), true)) {
        why = "tools/list failed: its answer is not a list of tools";
        child->kill(why);
        return nullptr;
      }
      if (!list.contains("nextCursor") || !list["nextCursor"].is_string()) break;
      cursor = list["nextCursor"].get<std::string>();
    }
    return child;
  }
  // Skills: initialize says what it has; then it is loaded.
  auto r = child->call("initialize", "{}", deadline_ms);
  if (r.ending != JsonRpcChild::Reply::Ending::result) return failed("initialize", r);
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
  } else if (options_.dialect == Dialect::skill_runtime) {
    r = child->call("tools/list", "{}", deadline_ms);
    if (r.ending != JsonRpcChild::Reply::Ending::result) return failed("tools/list", r);
    const auto list = json::parse(r.result, nullptr, false);
    if (!list.is_object() || !add_tools(list.value("tools", json()), true)) {
      why = "tools/list failed: its answer is not a list of tools";
      child->kill(why);
      return nullptr;
    }
  }
  if (options_.dialect == Dialect::skill_runtime) {
    json manifest = json::parse(options_.skill_manifest_json.empty() ? "{}" : options_.skill_manifest_json, nullptr, false);
    r = child->call("skill/load", json{{"manifest", manifest}, {"dataDir", options_.data_dir}}.dump(), deadline_ms);
    if (r.ending != JsonRpcChild::Reply::Ending::result) return failed("skill/load", r);
    r = child->call("skill/activate", "{}", deadline_ms);
    if (r.ending != JsonRpcChild::Reply::Ending::result) return failed("skill/activate", r);
  } else {
    r = child->call("lifecycle/onLoad", "{}", deadline_ms);
    if (r.ending != JsonRpcChild::Reply::Ending::result && r.ending != JsonRpcChild::Reply::Ending::error)
      return failed("lifecycle/onLoad", r);
  }
  return child;
}

std::vector<RemoteTool> JsonRpcToolset::start() {
  std::lock_guard start_lock(start_mu_);
  std::vector<RemoteTool> tools;
  std::string why;
  bool modern = false;
  auto child = launch(steady_now_ms() + options_.start_timeout_ms, &tools, why, modern);
  if (!child) throw HostError(why);
  std::lock_guard lock(mu_);
  child_ = std::move(child);
  child_modern_ = modern;
  return tools;
}

std::shared_ptr<JsonRpcChild> JsonRpcToolset::live_child(std::int64_t deadline_ms, std::string& why) {
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
  for (const auto& id : sessions) lifecycle_on(child, "lifecycle/onSessionStart", "skill/sessionStart", session_params(id));
  return child;
}

RunOutcome JsonRpcToolset::call(const RunSpec& spec, const std::string& tool) {
  const auto t0 = Clock::now();
  RunOutcome out;
  const std::string what = std::string(kind() == "mcp" ? "MCP server " : "skill ") + options_.name;
  int jsonrpc_error = 0;
  auto finish = [&](pid_t pid) {
    // The trace, written directly (this is on every call's path).
    std::string& t = spec.call.trace_json;
    t.clear();
    t += "{\"runner\":\"";
    t += kind();
    t += "\",\"server\":";
    append_json_string(t, options_.name);
    t += ",\"tool\":";
    append_json_string(t, tool);
    t += ",\"timeout_ms\":" + std::to_string(spec.timeout_ms);
    if (!spec.trace_id.empty()) {
      t += ",\"trace_id\":";
      append_json_string(t, spec.trace_id);
    }
    if (pid > 0) t += ",\"child_pid\":" + std::to_string(pid);
    if (jsonrpc_error != 0) t += ",\"jsonrpc_error\":" + std::to_string(jsonrpc_error);
    char ms[32];
    std::snprintf(ms, sizeof ms, "%.3f", millis_since(t0));
    t += ",\"duration_ms\":";
    t += ms;
    t += '}';
    return out;
  };
  if (!is_object_text(spec.input_json)) {
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
    JsonRpcToolset& set;
    const std::int64_t& id;
    const std::string& token;
    ~Forget() {
      std::lock_guard lock(set.mu_);
      set.in_flight_.erase(id);
      if (!token.empty()) set.by_token_.erase(token);
    }
  };
  JsonRpcChild::Reply reply;
  {
    Forget forget{*this, sent_id, token};
    reply = child->call("tools/call", params, spec.deadline_ms, spec.cancel, [&](std::int64_t id) {
      sent_id = id;
      std::lock_guard lock(mu_);
      in_flight_[id] = &flight;
    });
  }
  std::lock_guard call_lock(flight.mu);  // (a state request answered just now is done with it)
  using Ending = JsonRpcChild::Reply::Ending;
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
      std::string output;
      if (!fast_output(reply.result, output)) {
        const auto result = json::parse(reply.result, nullptr, false);
        if (result.is_object() && result.value("isError", false) == true) {
          spec.call.error = content_text(result.value("content", json(""))).substr(0, kMaxToolErrorBytes);
          if (spec.call.error.empty()) spec.call.error = "the tool reported an error";
          out.rc = MACHINA_TOOL_ERROR;
          return finish(child->pid());
        }
        output = output_of(result);
      }
      spec.call.set_output(std::move(output));
      out.rc = MACHINA_TOOL_OK;
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
    case Ending::closed:
      out.ending = RunOutcome::Ending::closed;
      return finish(0);
  }
  return finish(0);
}

void JsonRpcToolset::on_request(const jsonrpc::Message& request, std::string& reply) {
  const std::string& m = request.method;
  if (m == "ping") return jsonrpc::append_result(reply, request.id, "{}");
  if (options_.dialect != JsonRpcToolsetOptions::Dialect::mcp) {
    if (m == "state/get" || m == "state/set") return answer_state(request, reply);
    if (m == "data/read" || m == "data/write") return answer_data(request, reply);
  }
  // roots/list, sampling/createMessage, elicitation/create, ...: not offered.
  jsonrpc::append_error(reply, request.id, jsonrpc::kMethodNotFound, "Method not found",
                        json(m).dump(-1, ' ', false, json::error_handler_t::replace));
}

void JsonRpcToolset::answer_state(const jsonrpc::Message& request, std::string& reply) {
  const auto params = json::parse(request.params.empty() ? std::string_view("{}") : request.params, nullptr, false);
  if (!params.is_object()) return jsonrpc::append_error(reply, request.id, jsonrpc::kInvalidParams, "params must be an object");
  InFlight* flight = nullptr;
  std::unique_lock<std::mutex> call_lock;  // taken under mu_: the call cannot end meanwhile
  {
    std::lock_guard lock(mu_);
    if (params.contains("callId") && params["callId"].is_number_integer()) {
      if (auto it = in_flight_.find(params["callId"].get<std::int64_t>()); it != in_flight_.end()) flight = it->second;
    } else if (in_flight_.size() == 1) {
      flight = in_flight_.begin()->second;
    }
    if (flight != nullptr) call_lock = std::unique_lock(flight->mu);
  }
  if (flight == nullptr) {
    return jsonrpc::append_error(reply, request.id, jsonrpc::kInvalidParams,
                                 "state belongs to a call: name it (callId, the tools/call request's id) or have "
                                 "exactly one call in flight");
  }
  CallContext& call = *flight->call;
  if (request.method == "state/get") {
    const auto effective = [&](int slot) -> const std::optional<Artifact>& {
      const auto bit = static_cast<std::uint8_t>(1u << slot);
      if (call.changes && (call.changes->set & bit)) return call.changes->slots[slot];
      static const std::optional<Artifact> none;
      if (call.changes && (call.changes->removed & bit)) return none;
      return call.state()[slot];
    };
    if (params.contains("slot")) {
      const int slot = slot_of(params["slot"]);
      if (slot < 0) return jsonrpc::append_error(reply, request.id, jsonrpc::kInvalidParams, "slot must be 0..7 or DS0..DS7");
      const auto& a = effective(slot);
      return jsonrpc::append_result(
          reply, request.id, json{{"slot", "DS" + std::to_string(slot)}, {"artifact", a ? artifact_json(*a) : json()}}.dump());
    }
    json slots = json::object();
    for (int i = 0; i < static_cast<int>(kDsSlots); ++i) {
      if (const auto& a = effective(i)) slots["DS" + std::to_string(i)] = artifact_json(*a);
    }
    return jsonrpc::append_result(reply, request.id, json{{"slots", slots}}.dump());
  }
  // state/set {slot, type, content (any JSON) or content_json (text), provenance}; null
  // content empties the slot.
  const int slot = params.contains("slot") ? slot_of(params["slot"]) : -1;
  if (slot < 0) return jsonrpc::append_error(reply, request.id, jsonrpc::kInvalidParams, "slot must be 0..7 or DS0..DS7");
  SlotChanges& w = call.writes();
  const auto bit = static_cast<std::uint8_t>(1u << slot);
  if (params.contains("content") && params["content"].is_null()) {
    w.slots[slot].reset();
    w.set = static_cast<std::uint8_t>(w.set & ~bit);
    w.removed = static_cast<std::uint8_t>(w.removed | bit);
    return jsonrpc::append_result(reply, request.id, R"({"ok":true})");
  }
  std::string content;
  if (params.contains("content_json") && params["content_json"].is_string()) {
    content = params["content_json"].get<std::string>();
    if (!validate_json(content)) return jsonrpc::append_error(reply, request.id, jsonrpc::kInvalidParams, "content_json is not JSON");
  } else if (params.contains("content")) {
    content = params["content"].dump();
  } else {
    return jsonrpc::append_error(reply, request.id, jsonrpc::kInvalidParams, "give content (JSON) or content_json (text)");
  }
  const std::string type = params.contains("type") && params["type"].is_string() ? params["type"].get<std::string>() : "";
  const std::string provenance = params.contains("provenance") && params["provenance"].is_string()
                                     ? params["provenance"].get<std::string>()
                                     : "skill:" + options_.name;
  w.slots[slot] = Artifact{type, content, provenance, content.size()};
  w.set = static_cast<std::uint8_t>(w.set | bit);
  w.removed = static_cast<std::uint8_t>(w.removed & ~bit);
  jsonrpc::append_result(reply, request.id, R"({"ok":true})");
}

void JsonRpcToolset::answer_data(const jsonrpc::Message& request, std::string& reply) {
  const auto params = json::parse(request.params.empty() ? std::string_view("{}") : request.params, nullptr, false);
  if (!params.is_object() || !params.contains("path") || !params["path"].is_string())
    return jsonrpc::append_error(reply, request.id, jsonrpc::kInvalidParams, "params must name a path");
  std::vector<std::string> parts;
  std::string why;
  if (!workspace::split(params["path"].get<std::string>(), parts, why))
    return jsonrpc::append_error(reply, request.id, jsonrpc::kInvalidParams, "path refused: " + why);
  workspace::Workspace ws;
  if (!ws.open(options_.data_dir, why))
    return jsonrpc::append_error(reply, request.id, jsonrpc::kInternalError, "the data directory cannot be opened: " + why);
  if (request.method == "data/read") {
    workspace::Fd fd = ws.open_for_reading(parts, why);
    if (!fd) return jsonrpc::append_result(reply, request.id, json{{"exists", false}, {"why", why}}.dump());
    std::string content(options_.max_data_bytes + 1, '\0');
    std::size_t got = 0;
    while (got < content.size()) {
      const ssize_t n = ::read(fd.get(), content.data() + got, content.size() - got);
      if (n <= 0) break;
      got += static_cast<std::size_t>(n);
    }
    if (got > options_.max_data_bytes)
      return jsonrpc::append_error(reply, request.id, jsonrpc::kInvalidParams,
                                   "the file is larger than " + std::to_string(options_.max_data_bytes) + " bytes");
    content.resize(got);
    return jsonrpc::append_result(reply, request.id, json{{"exists", true}, {"content", to_valid_utf8(content)}}.dump());
  }
  if (!params.contains("content") || !params["content"].is_string())
    return jsonrpc::append_error(reply, request.id, jsonrpc::kInvalidParams, "data/write needs content (a string)");
  const std::string content = params["content"].get<std::string>();
  if (content.size() > options_.max_data_bytes)
    return jsonrpc::append_error(reply, request.id, jsonrpc::kInvalidParams,
                                 "content is larger than " + std::to_string(options_.max_data_bytes) + " bytes");
  if (!ws.write(parts, content, false, why))
    return jsonrpc::append_error(reply, request.id, jsonrpc::kInvalidParams, "cannot write: " + why);
  jsonrpc::append_result(reply, request.id, json{{"ok", true}, {"bytes", content.size()}}.dump());
}

void JsonRpcToolset::on_notification(const jsonrpc::Message& notification) {
  if (notification.method != "notifications/progress") return;  // (log messages and list changes: not kept)
  const auto params = json::parse(notification.params.empty() ? std::string_view("{}") : notification.params, nullptr, false);
  if (!params.is_object() || !params.contains("progressToken") || !params.contains("progress") ||
      !params["progress"].is_number())
    return;
  const std::string token = text_of(params["progressToken"]);
  std::lock_guard lock(mu_);
  auto it = by_token_.find(token);
  if (it == by_token_.end() || it->second->progress == nullptr) return;
  const double total = params.contains("total") && params["total"].is_number() ? params["total"].get<double>() : -1;
  const std::string message = params.contains("message") && params["message"].is_string() ? params["message"].get<std::string>() : "";
  it->second->progress->progress(params["progress"].get<double>(), total, message);
}

void JsonRpcToolset::lifecycle(const char* seed_method, const char* runtime_method, const std::string& params) {
  std::shared_ptr<JsonRpcChild> child;
  {
    std::lock_guard lock(mu_);
    child = child_;
  }
  lifecycle_on(child, seed_method, runtime_method, params);
}

void JsonRpcToolset::lifecycle_on(const std::shared_ptr<JsonRpcChild>& child, const char* seed_method,
                                  const char* runtime_method, const std::string& params) {
  if (options_.dialect == JsonRpcToolsetOptions::Dialect::mcp) return;
  if (!child || !child->alive()) return;
  const char* method = options_.dialect == JsonRpcToolsetOptions::Dialect::skill_runtime ? runtime_method : seed_method;
  const auto r = child->call(method, params, steady_now_ms() + 5'000);
  if (r.ending != JsonRpcChild::Reply::Ending::result && r.ending != JsonRpcChild::Reply::Ending::error &&
      options_.on_event) {
    options_.on_event("skill " + options_.name + ": " + method + " got no answer (" + r.message + ")");
  }
}

void JsonRpcToolset::session_started(const std::string& id) {
  {
    std::lock_guard lock(mu_);
    if (sessions_.size() >= kMaxSessions) sessions_.erase(sessions_.begin());  // (bounded: one is forgotten)
    sessions_.insert(id);
  }
  lifecycle("lifecycle/onSessionStart", "skill/sessionStart", session_params(id));
}

void JsonRpcToolset::session_ended(const std::string& id) {
  {
    std::lock_guard lock(mu_);
    sessions_.erase(id);
  }
  lifecycle("lifecycle/onSessionEnd", "skill/sessionEnd", session_params(id));
}

void JsonRpcToolset::background_loop() {
  std::unique_lock lock(mu_);
  auto next_tick = steady_now_ms() + options_.tick_interval_ms;
  for (;;) {
    if (closed_) return;
    if (!to_probe_.empty()) {
      auto probe = std::move(to_probe_);
      to_probe_.clear();
      lock.unlock();
      for (auto& child : probe) {
        if (!child->alive()) continue;
        const auto r = child->call("ping", "{}", steady_now_ms() + options_.probe_timeout_ms);
        // Any answer, an error included, says it still reads and writes.
        if (r.ending == JsonRpcChild::Reply::Ending::timed_out) {
          child->kill("hung: it did not answer a ping within " + std::to_string(options_.probe_timeout_ms) +
                      " ms after a call timed out, and was killed");
          if (options_.on_event) options_.on_event(std::string(kind()) + " " + options_.name + " hung and was killed");
        }
      }
      lock.lock();
      continue;
    }
    const bool ticking = options_.tick_interval_ms > 0 && options_.dialect != JsonRpcToolsetOptions::Dialect::mcp;
    if (ticking && steady_now_ms() >= next_tick) {
      next_tick = steady_now_ms() + options_.tick_interval_ms;
      lock.unlock();
      lifecycle("lifecycle/onTick", "skill/tick", "{}");
      lock.lock();
      continue;
    }
    if (ticking) wake_.wait_until(lock, Clock::time_point(std::chrono::milliseconds(next_tick)));
    else wake_.wait(lock);
  }
}

void JsonRpcToolset::close() {
  std::shared_ptr<JsonRpcChild> child;
  {
    std::lock_guard lock(mu_);
    if (closed_) return;
    closed_ = true;
    child = std::move(child_);
    wake_.notify_all();
  }
  if (!child || !child->alive()) return;
  if (options_.dialect != JsonRpcToolsetOptions::Dialect::mcp) {
    const char* method = options_.dialect == JsonRpcToolsetOptions::Dialect::skill_runtime ? "skill/shutdown" : "shutdown";
    child->call(method, "{}", steady_now_ms() + options_.shutdown_grace_ms);
  }
  child->finish(options_.shutdown_grace_ms);
}

}  // namespace machina
