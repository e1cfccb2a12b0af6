// See remote_mcp_server.hpp.
#include "remote_tool_output.hpp"

#include <machina/clock.hpp>
#include <machina/errors.hpp>
#include <machina/json_text.hpp>
#include <machina/jsonrpc.hpp>
#include <machina/runners/remote_mcp_server.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>

#ifndef MACHINA_VERSION
#define MACHINA_VERSION "dev"
#endif

namespace machina {
namespace {

using json = nlohmann::json;

// The revision asked for at initialize: its event streams end with their response (a later
// revision lets a server end one early and have the client resume it, which this client
// does not).
constexpr const char* kVersion = "2025-06-18";
constexpr std::size_t kMaxTools = 10'000;
constexpr int kMaxPages = 1'000;
constexpr std::int64_t kCancelNoticeMs = 500;  // how long telling the server of a timeout may take

/// The JSON-RPC messages of an answer: its JSON body, or the data of each event of an event
/// stream (its `data:` lines joined).
std::vector<std::string> messages_of(const http::Reply& reply) {
  std::string type = reply.header("Content-Type");
  std::transform(type.begin(), type.end(), type.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (type.find("text/event-stream") == std::string::npos) return {reply.body};
  std::vector<std::string> out;
  std::string data;
  bool has_data = false;
  std::size_t at = 0;
  const std::string& b = reply.body;
  while (at <= b.size()) {
    std::size_t end = b.find('\n', at);
    if (end == std::string::npos) end = b.size();
    std::string_view line(b.data() + at, end - at);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) {  // an event ends
      if (has_data) out.push_back(std::move(data));
      data.clear();
      has_data = false;
    } else if (line == "data" || line.starts_with("data:")) {
      line.remove_prefix(std::min<std::size_t>(5, line.size()));
      if (line.starts_with(' ')) line.remove_prefix(1);
      if (has_data) data.push_back('\n');
      data.append(line);
      has_data = true;
    }
    at = end + 1;
  }
  if (has_data) out.push_back(std::move(data));
  return out;
}

/// Whether a revision the server names is one to send back in a header (YYYY-MM-DD).
bool revision_text(const std::string& v) {
  return v.size() == 10 && std::all_of(v.begin(), v.end(), [](unsigned char c) { return std::isdigit(c) || c == '-'; });
}

}  // namespace

RemoteMcpServer::RemoteMcpServer(RemoteMcpOptions options) : options_(std::move(options)) {
  std::string why;
  if (!http::Url::parse(options_.url, url_, why)) throw ConfigError("MCP server " + options_.name + ": " + why);
  client_ = std::make_unique<http::Client>(url_, options_.ca_file);
  if (!client_->unusable().empty()) throw ConfigError("MCP server " + options_.name + ": " + client_->unusable());
}

RemoteMcpServer::~RemoteMcpServer() {
  close();
}

http::Headers RemoteMcpServer::headers_with(const Session& session) const {
  http::Headers h = {{"Accept", "application/json, text/event-stream"}};
  if (!session.version.empty()) h.emplace_back("MCP-Protocol-Version", session.version);
  if (!session.id.empty()) h.emplace_back("Mcp-Session-Id", session.id);
  h.insert(h.end(), options_.headers.begin(), options_.headers.end());
  return h;
}

RemoteMcpServer::Session RemoteMcpServer::current() {
  std::lock_guard lock(mu_);
  return session_;
}

RemoteMcpServer::Answer RemoteMcpServer::send_once(const std::string& method, const std::string& params,
                                                   std::int64_t deadline_ms, const Session& session, bool& session_gone,
                                                   std::string* session_id) {
  Answer a;
  a.id = next_id_++;
  std::string body;
  jsonrpc::append_request(body, std::to_string(a.id), method, params);
  while (!body.empty() && body.back() == '\n') body.pop_back();
  const http::Reply reply =
      client_->post(url_.target, body, headers_with(session), deadline_ms, options_.max_answer_bytes);
  session_gone = false;
  switch (reply.failure) {
    case http::Reply::Failure::none: break;
    case http::Reply::Failure::timed_out: a.ending = Answer::Ending::timed_out; return a;
    default: a.message = reply.detail; return a;
  }
  if (reply.status == 404 && !session.id.empty()) {
    session_gone = true;
    a.message = "the server ended the session";
    return a;
  }
  if (reply.status != 200) {
    a.message = "it answered HTTP " + std::to_string(reply.status) + " (" + excerpt(to_valid_utf8(reply.body)) + ")";
    return a;
  }
  if (session_id != nullptr) *session_id = reply.header("Mcp-Session-Id");
  const std::string id = std::to_string(a.id);
  for (const std::string& text : messages_of(reply)) {
    jsonrpc::Message m;
    std::string why;
    if (!jsonrpc::parse(text, m, why) || m.id != id) continue;  // (its notifications, and what is not ours)
    if (m.kind == jsonrpc::Message::Kind::result) {
      a.ending = Answer::Ending::result;
      a.result = std::string(m.result);
      return a;
    }
    if (m.kind == jsonrpc::Message::Kind::error) {
      a.ending = Answer::Ending::error;
      a.code = m.error_code;
      a.message = m.error_message;
      return a;
    }
  }
  a.message = "its answer holds no response to the request";
  return a;
}

RemoteMcpServer::Answer RemoteMcpServer::request(const std::string& method, const std::string& params,
                                                 std::int64_t deadline_ms) {
  Session session = current();
  bool gone = false;
  Answer a = send_once(method, params, deadline_ms, session, gone);
  if (!gone) return a;
  // The server ended the session: a new one (unless another call has opened it meanwhile),
  // and the request once more.
  std::unique_lock opening(open_mu_, std::defer_lock);
  if (!opening.try_lock_until(std::chrono::steady_clock::now() +
                              std::chrono::milliseconds(std::max<std::int64_t>(0, deadline_ms - steady_now_ms())))) {
    a.ending = Answer::Ending::timed_out;
    return a;
  }
  std::string why;
  {
    std::lock_guard lock(mu_);
    if (closed_) {
      a.message = "the server ended the session, and the host is closing";
      return a;
    }
  }
  if (current().id == session.id && !open_session(deadline_ms, why)) {
    a.message = "the server ended the session, and a new one could not be opened: " + why;
    return a;
  }
  opening.unlock();
  return send_once(method, params, deadline_ms, current(), gone);
}

void RemoteMcpServer::notify(const std::string& method, const std::string& params, std::int64_t deadline_ms,
                             const Session& session) {
  std::string body;
  jsonrpc::append_notification(body, method, params);
  while (!body.empty() && body.back() == '\n') body.pop_back();
  (void)client_->post(url_.target, body, headers_with(session), deadline_ms, 64 * 1024);
}

bool RemoteMcpServer::open_session(std::int64_t deadline_ms, std::string& why) {
  const json init = {{"protocolVersion", kVersion},
                     {"capabilities", json::object()},
                     {"clientInfo", {{"name", "machina-toolhost"}, {"version", MACHINA_VERSION}}}};
  bool gone = false;
  Session opened;
  const Answer a = send_once("initialize", init.dump(), deadline_ms, Session{}, gone, &opened.id);
  if (a.ending != Answer::Ending::result) {
    why = "initialize failed: " + (a.ending == Answer::Ending::timed_out ? std::string("no answer in time")
                                   : a.ending == Answer::Ending::error
                                       ? "error " + std::to_string(a.code) + ": " + a.message
                                       : a.message);
    return false;
  }
  const auto result = json::parse(a.result, nullptr, false);
  if (!result.is_object() || !result.contains("protocolVersion") || !result["protocolVersion"].is_string() ||
      !revision_text(result["protocolVersion"].get<std::string>())) {
    why = "initialize failed: its answer names no protocolVersion (YYYY-MM-DD)";
    return false;
  }
  if (opened.id.find_first_of("\r\n") != std::string::npos) {
    why = "initialize failed: its Mcp-Session-Id is not one line";
    return false;
  }
  opened.version = result["protocolVersion"].get<std::string>();
  notify("notifications/initialized", "", deadline_ms, opened);
  std::lock_guard lock(mu_);
  session_ = std::move(opened);  // (other calls use it from now on)
  return true;
}

std::vector<RemoteTool> RemoteMcpServer::start() {
  const std::int64_t deadline_ms = steady_now_ms() + options_.start_timeout_ms;
  const std::string what = "MCP server " + options_.name + " (" + options_.url + ")";
  std::string why;
  {
    std::lock_guard opening(open_mu_);
    if (!open_session(deadline_ms, why)) throw ConfigError(what + ": " + why);
  }
  std::vector<RemoteTool> tools;
  std::string cursor;
  for (int page = 0; page < kMaxPages; ++page) {
    const json params = cursor.empty() ? json::object() : json{{"cursor", cursor}};
    const Answer a = request("tools/list", params.dump(), deadline_ms);
    if (a.ending != Answer::Ending::result)
      throw ConfigError(
          what + ": tools/list failed: " +
          (a.ending == Answer::Ending::error ? "error " + std::to_string(a.code) + ": " + a.message : a.message));
    const auto list = json::parse(a.result, nullptr, false);
    if (!list.is_object() || !list.contains("tools") || !list["tools"].is_array())
      throw ConfigError(what + ": tools/list answered no list of tools");
    for (const auto& t : list["tools"]) {
      if (!t.is_object() || !t.contains("name") || !t["name"].is_string() || t["name"].get<std::string>().empty())
        throw ConfigError(what + ": tools/list answered a tool without a name");
      if (tools.size() < kMaxTools) tools.push_back(remote_output::remote_tool_of(t, /*mcp=*/true));
    }
    if (!list.contains("nextCursor") || !list["nextCursor"].is_string()) break;
    cursor = list["nextCursor"].get<std::string>();
  }
  return tools;
}

RunOutcome RemoteMcpServer::call(const RunSpec& spec, const std::string& tool) {
  const auto t0 = std::chrono::steady_clock::now();
  RunOutcome out;
  const std::string what = "MCP server " + options_.name;
  int jsonrpc_error = 0;
  auto finish = [&] {
    remote_output::write_call_trace(spec.call.trace_json, {.runner = "mcp",
                                                           .server = options_.name,
                                                           .url = options_.url,
                                                           .tool = tool,
                                                           .trace_id = spec.trace_id,
                                                           .timeout_ms = spec.timeout_ms,
                                                           .jsonrpc_error = jsonrpc_error,
                                                           .duration_ms = millis_since(t0)});
    return out;
  };
  {
    std::lock_guard lock(mu_);
    if (closed_) {
      out.ending = RunOutcome::Ending::closed;
      return finish();
    }
  }
  if (!starts_json_object(spec.input_json)) {
    out.ending = RunOutcome::Ending::failed;
    out.failure = ErrorKind::invalid_input;
    out.detail = "the input of " + what + "'s tool " + tool + " must be a JSON object (its arguments)";
    return finish();
  }
  std::string params = "{\"name\":";
  append_json_string(params, tool);
  params += ",\"arguments\":";
  params.append(spec.input_json);
  params += "}";
  const Answer a = request("tools/call", params, spec.deadline_ms);
  switch (a.ending) {
    case Answer::Ending::result: out.rc = remote_output::take_result(a.result, spec.call); return finish();
    case Answer::Ending::error:
      out.rc = MACHINA_TOOL_ERROR;
      spec.call.error = "error " + std::to_string(a.code) + ": " + a.message;
      jsonrpc_error = a.code;
      return finish();
    case Answer::Ending::timed_out: {
      const json note = {{"requestId", a.id}, {"reason", "timed out"}};
      notify("notifications/cancelled", note.dump(), steady_now_ms() + kCancelNoticeMs, current());
      out.ending = RunOutcome::Ending::timed_out;
      out.detail = what + " was told notifications/cancelled";
      return finish();
    }
    case Answer::Ending::failed:
      out.ending = RunOutcome::Ending::failed;
      out.failure = ErrorKind::service_unavailable;
      out.detail = what + ": " + a.message;
      return finish();
  }
  return finish();
}

void RemoteMcpServer::close() {
  Session session;
  {
    std::lock_guard lock(mu_);
    if (closed_) return;
    closed_ = true;
    session = std::move(session_);
  }
  if (session.id.empty()) return;
  (void)client_->send("DELETE", url_.target, "", headers_with(session), steady_now_ms() + kCancelNoticeMs, 64 * 1024);
}

}  // namespace machina
