// See mcp_skill_codec.hpp.
#include "mcp_skill_codec.hpp"

#include "mcp_tool_call.hpp"

#include <machina/json_text.hpp>
#include <machina/jsonrpc.hpp>
#include <machina/ndjson_wire.hpp>
#include <machina/tool_names.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <optional>

#ifndef MACHINA_VERSION
#define MACHINA_VERSION "dev"
#endif

namespace machina::cli {
namespace {

using json = nlohmann::ordered_json;
using jsonrpc::Member;

// The MCP and skill fronts' callers speak on this process's standard streams.
constexpr FrontLabel kMcpFront{"mcp", /*local_caller=*/true};
constexpr FrontLabel kSkillFront{"skill", /*local_caller=*/true};

constexpr std::size_t kMaxCancelledIds = 4096;
constexpr const char* kLatestVersion = "2025-11-25";
// The MCP revisions of the initialize handshake this front speaks (an older or newer
// request is answered with the latest).
constexpr const char* kVersions[] = {"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"};
// The revision without a handshake: each request says its version in the `_meta` envelope.
constexpr std::string_view kModernVersion = "2026-07-28";
constexpr std::string_view kVersionKey = "io.modelcontextprotocol/protocolVersion";
constexpr std::string_view kCapabilitiesKey = "io.modelcontextprotocol/clientCapabilities";
constexpr int kUnsupportedProtocolVersion = -32022;
// Results of the 2026-07-28 revision: complete (never input_required: this front asks the
// client nothing), reusable only within one authorization context and stale at once — the
// official SDK server's defaults, which promise a cache nothing this front has not checked.
constexpr const char kModernCacheHints[] = R"("resultType":"complete","cacheScope":"private","ttlMs":0)";
void invalid_params(std::string& out, std::string_view id, const std::string& why,
                    ErrorKind kind = ErrorKind::malformed_request) {
  jsonrpc::append_error(out, id, jsonrpc::kInvalidParams, why, error_data(kind));
}

/// A call's progress, reported as notifications/progress with the caller's token.
class TokenProgress final : public ProgressSink {
 public:
  TokenProgress(std::string_view token, const LineCodec::WriteNow& write_now) : token_(token), write_now_(write_now) {}
  void progress(double done, double total, std::string_view message) override {
    if (!write_now_) return;
    json params = {{"progressToken", json::parse(token_, nullptr, false)}, {"progress", done}};
    if (total >= 0) params["total"] = total;
    if (!message.empty()) params["message"] = std::string(message);
    std::string line;
    jsonrpc::append_notification(line, "notifications/progress",
                                 params.dump(-1, ' ', false, json::error_handler_t::replace));
    write_now_(line);
  }

 private:
  std::string token_;
  const LineCodec::WriteNow& write_now_;
};

/// What a request's params carry of the 2026-07-28 envelope (`params._meta`).
struct Envelope {
  bool meta_object = false;  // params._meta is an object
  bool has_version = false;
  bool has_capabilities = false;
  Member::Type version_type = Member::Type::null;
  std::string version;  // (a string version, decoded)
};

/// (From the members the message's parse kept: on the way of every request, only a `_meta`
/// is read a second time.)
Envelope read_envelope(const jsonrpc::Message& message) {
  Envelope e;
  if (!starts_json_object(message.params)) return e;
  std::string_view meta;
  std::string why;
  jsonrpc::each_param(
      message,
      [&](const Member& m) {
        if (m.key == "_meta") {
          e.meta_object = m.type == Member::Type::object;
          meta = e.meta_object ? m.raw : std::string_view();
        }
        return true;
      },
      why);
  if (meta.empty()) return e;
  jsonrpc::for_each_member(
      meta,
      [&](const Member& m) {
        if (m.key == kVersionKey) {
          e.has_version = true;
          e.version_type = m.type;
          e.version = m.type == Member::Type::string ? std::string(m.string) : std::string();
        } else if (m.key == kCapabilitiesKey) {
          e.has_capabilities = true;
        }
        return true;
      },
      why);
  return e;
}

/// The 2026-07-28 error for a protocol version this front does not serve; `requested` is
/// named when it is a string.
void unsupported_version(std::string& out, std::string_view id, std::string_view message,
                         const std::optional<std::string>& requested) {
  json data = {{"supported", {std::string(kModernVersion)}}};
  if (requested) data["requested"] = *requested;
  jsonrpc::append_error(out, id, kUnsupportedProtocolVersion, message,
                        data.dump(-1, ' ', false, json::error_handler_t::replace));
}

}  // namespace

bool McpSkillCodec::serves_version(std::string_view version) {
  return version == kModernVersion ||
         std::find(std::begin(kVersions), std::end(kVersions), version) != std::end(kVersions);
}

McpSkillCodec::McpSkillCodec(Dialect dialect, std::size_t page_size, std::optional<Caller> caller)
    : dialect_(dialect), page_size_(page_size), caller_(std::move(caller)) {}

McpSkillCodec::Era McpSkillCodec::settle_era(const jsonrpc::Message& m) {
  Era era = era_.load(std::memory_order_acquire);
  if (era != Era::open || dialect_ != Dialect::mcp || m.kind != jsonrpc::Message::Kind::request) return era;
  const Era chosen = m.method != "initialize" && read_envelope(m).has_version ? Era::modern : Era::handshake;
  // (The first to settle it wins; a request read later never changes it.)
  if (era_.compare_exchange_strong(era, chosen, std::memory_order_acq_rel)) return chosen;
  return era;
}

LineCodec::Peek McpSkillCodec::peek(std::string_view line) {
  if (dialect_ == Dialect::mcp && era_.load(std::memory_order_acquire) == Era::open) {
    // Lines are peeked in the order they are read: the connection's first request settles
    // its era before any later line is handled.
    jsonrpc::Message first;
    std::string ignored;
    if (jsonrpc::parse(line, first, ignored)) settle_era(first);
  }
  const bool cancelling = line.find("notifications/cancelled") != std::string_view::npos;
  const bool shutdown = dialect_ == Dialect::skill && line.find("\"shutdown\"") != std::string_view::npos;
  if (!cancelling && !shutdown) return Peek::handle;
  jsonrpc::Message m;
  std::string why;
  if (!jsonrpc::parse(line, m, why)) return Peek::handle;
  if (m.kind == jsonrpc::Message::Kind::notification && m.method == "notifications/cancelled") {
    std::string id;
    jsonrpc::for_each_member(
        m.params,
        [&](const Member& member) {
          if (member.key == "requestId" && (member.type == Member::Type::number || member.type == Member::Type::string))
            id = std::string(member.raw);
          return true;
        },
        why);
    if (!id.empty()) cancel(id);
    return Peek::done;
  }
  if (m.kind == jsonrpc::Message::Kind::request && m.method == "shutdown" && dialect_ == Dialect::skill)
    return Peek::handle_then_stop;
  return Peek::handle;
}

void McpSkillCodec::cancel(const std::string& id) {
  CancelToken* token = nullptr;
  {
    std::lock_guard lock(mu_);
    if (cancelled_.insert(id).second) {
      cancelled_order_.push_back(id);
      if (cancelled_order_.size() > kMaxCancelledIds) {
        cancelled_.erase(cancelled_order_.front());
        cancelled_order_.pop_front();
      }
    }
    if (auto it = running_.find(id); it != running_.end()) token = it->second;
    // The token's callback runs under mu_: the call cannot end (and its token go) meanwhile.
    if (token != nullptr) token->cancel();
  }
}

bool McpSkillCodec::forget_if_cancelled(const std::string& id) {
  std::lock_guard lock(mu_);
  return cancelled_.count(id) != 0;
}

LineCodec::Handled McpSkillCodec::handle(Host& host, std::string_view line, CallerState& session, std::string& out,
                                         OverrunSink* overrun_sink) {
  Handled handled;
  handled.has_id = true;  // every answer is matched by its id: none waits for another
  jsonrpc::Message m;
  std::string why;
  if (!jsonrpc::parse(line, m, why)) {
    jsonrpc::append_error(out, "null", jsonrpc::kParseError, "Parse error: " + why,
                          error_data(ErrorKind::malformed_request));
    return handled;
  }
  using Kind = jsonrpc::Message::Kind;
  if (m.kind == Kind::invalid) {
    const bool usable_id =
        !m.id.empty() && (m.id.front() == '"' || m.id.front() == '-' || (m.id.front() >= '0' && m.id.front() <= '9'));
    jsonrpc::append_error(out, usable_id ? m.id : "null", jsonrpc::kInvalidRequest, "Invalid Request: " + m.why,
                          error_data(ErrorKind::malformed_request));
    return handled;
  }
  if (m.kind == Kind::request && !m.id.empty() && m.id.front() != '"' &&
      m.id.find_first_of(".eE") != std::string_view::npos) {
    // (JSON-RPC says an id SHOULD NOT hold a fraction; this front takes integers and strings.)
    jsonrpc::append_error(out, "null", jsonrpc::kInvalidRequest,
                          "Invalid Request: the id must be a string or an integer",
                          error_data(ErrorKind::malformed_request));
    return handled;
  }
  if (m.kind == Kind::result || m.kind == Kind::error) return handled;  // (we ask the client nothing)
  if (m.kind == Kind::notification) {
    if (m.method == "notifications/cancelled")
      peek(line);  // (inline serving: read here, not before)
    else if (dialect_ == Dialect::skill && m.method.rfind("lifecycle/", 0) == 0) {
      // (a lifecycle notification: nothing to answer)
    }
    return handled;
  }
  const std::string id(m.id);
  const std::string& method = m.method;
  if (dialect_ == Dialect::mcp) {
    if (settle_era(m) == Era::modern) {
      serve_modern(host, id, m, session, out, overrun_sink, handled);
      return handled;
    }
    if (method != "initialize" && read_envelope(m).has_version) {
      jsonrpc::append_error(out, id, jsonrpc::kInvalidRequest,
                            "this connection serves the handshake protocol era; requests carrying the 2026-07-28 "
                            "envelope are not accepted on it",
                            error_data(ErrorKind::malformed_request));
      return handled;
    }
  }
  if (method == "tools/call") {
    call(host, id, m, session, out, overrun_sink, handled);
    return handled;
  }
  if (method == "initialize") {
    initialize(host, id, m.params, out);
  } else if (method == "ping") {
    jsonrpc::append_result(out, id, "{}");
  } else if (method == "tools/list") {
    list_tools(host, id, m.params, out);
  } else if (dialect_ == Dialect::skill &&
             (method.rfind("lifecycle/", 0) == 0 || method.rfind("skill/", 0) == 0 || method == "shutdown")) {
    // A session's start and end reach the skills this host itself hosts.
    if (method == "lifecycle/onSessionStart" || method == "lifecycle/onSessionEnd" || method == "skill/sessionStart" ||
        method == "skill/sessionEnd") {
      std::string session_id;
      jsonrpc::for_each_member(
          m.params,
          [&](const Member& member) {
            if (member.key == "sessionId" && member.type == Member::Type::string)
              session_id = std::string(member.string);
            return true;
          },
          why);
      if (!session_id.empty()) {
        if (method.find("Start") != std::string::npos)
          host.connection_opened(session_id);
        else
          host.connection_closed(session_id);
      }
    }
    jsonrpc::append_result(out, id, R"({"ok":true})");
    // The answer to shutdown comes after every earlier request's: the process then exits.
    if (method == "shutdown") handled.has_id = false;
  } else {
    jsonrpc::append_error(out, id, jsonrpc::kMethodNotFound, "Method not found",
                          json(method).dump(-1, ' ', false, json::error_handler_t::replace));
  }
  return handled;
}

void McpSkillCodec::serve_modern(Host& host, const std::string& id, const jsonrpc::Message& m, CallerState& session,
                                 std::string& out, OverrunSink* overrun_sink, Handled& handled) {
  const std::string& method = m.method;
  std::string why;
  if (method == "initialize") {
    std::optional<std::string> requested;
    jsonrpc::for_each_member(
        m.params,
        [&](const Member& member) {
          if (member.key == "protocolVersion" && member.type == Member::Type::string)
            requested = std::string(member.string);
          return true;
        },
        why);
    return unsupported_version(
        out, id, "connection is serving the 2026-07-28 protocol; the initialize handshake is not accepted", requested);
  }
  const Envelope e = read_envelope(m);
  if (!e.meta_object) {
    return invalid_params(out, id,
                          "params._meta must be an object carrying the required '" + std::string(kVersionKey) +
                              "' and '" + std::string(kCapabilitiesKey) + "' envelope keys");
  }
  if (!e.has_version || !e.has_capabilities) {
    std::string missing = e.has_version ? "" : std::string(kVersionKey);
    if (!e.has_capabilities) missing += (missing.empty() ? "" : ", ") + std::string(kCapabilitiesKey);
    return invalid_params(out, id, "params._meta is missing the required envelope key(s): " + missing);
  }
  if (e.version_type != Member::Type::string)
    return invalid_params(out, id, "the protocol-version envelope value must be a string");
  if (e.version != kModernVersion) return unsupported_version(out, id, "Unsupported protocol version", e.version);
  if (method == "tools/call") return call(host, id, m, session, out, overrun_sink, handled);
  if (method == "tools/list") return list_tools(host, id, m.params, out);
  if (method == "server/discover") {
    std::string result = R"({"supportedVersions":[")";
    result.append(kModernVersion);
    result += R"("],"capabilities":{"tools":{"listChanged":false}},)";
    result += kModernCacheHints;
    result += R"(,"_meta":{)";
    result += server_info_stamp();
    result += "}}";
    return jsonrpc::append_result(out, id, result);
  }
  // (ping is not a method of this revision.)
  jsonrpc::append_error(out, id, jsonrpc::kMethodNotFound, "Method not found",
                        json(method).dump(-1, ' ', false, json::error_handler_t::replace));
}

void McpSkillCodec::initialize(Host& host, const std::string& id, std::string_view params, std::string& out) {
  if (dialect_ == Dialect::skill) {
    json tools = json::array();
    for (const Tool* t : host.registry().tools()) {
      const ToolInfo& i = t->info;
      if (!i.alias_of.empty()) continue;
      tools.push_back({{"name", i.aid}, {"description", i.description}, {"parameters", advertised_input_schema(i)}});
    }
    const json result = {
        {"name", "machina-toolhost"},
        {"description", "The tools of a machina-toolhost, each run with its deadline, caps and checks"},
        {"version", MACHINA_VERSION},
        {"tools", tools}};
    jsonrpc::append_result(out, id, result.dump(-1, ' ', false, json::error_handler_t::replace));
    return;
  }
  std::string requested, why;
  jsonrpc::for_each_member(
      params,
      [&](const Member& m) {
        if (m.key == "protocolVersion" && m.type == Member::Type::string) requested = std::string(m.string);
        return true;
      },
      why);
  std::string version = kLatestVersion;
  for (const char* v : kVersions) {
    if (requested == v) version = v;
  }
  const json result = {{"protocolVersion", version},
                       {"capabilities", {{"tools", {{"listChanged", false}}}}},
                       {"serverInfo", {{"name", "machina-toolhost"}, {"version", MACHINA_VERSION}}}};
  jsonrpc::append_result(out, id, result.dump());
}

void McpSkillCodec::list_tools(Host& host, const std::string& id, std::string_view params, std::string& out) {
  std::size_t from = 0;
  std::string bad, why;
  if (!params.empty()) {
    jsonrpc::for_each_member(
        params,
        [&](const Member& m) {
          if (m.key != "cursor" || m.type == Member::Type::null) return true;
          std::size_t at = 0;
          const auto [end, ec] = std::from_chars(m.string.data(), m.string.data() + m.string.size(), at);
          if (m.type != Member::Type::string || ec != std::errc() || end != m.string.data() + m.string.size()) {
            bad = "Invalid params: not a cursor this server gave";
            return false;
          }
          from = at;
          return true;
        },
        why);
  }
  if (!bad.empty()) return jsonrpc::append_error(out, id, jsonrpc::kInvalidParams, bad);
  // Another name of a tool (a pack tool's dispatch names) would show a model the same tool
  // twice: only primary names are listed (the others still answer calls).
  std::vector<const Tool*> all;
  for (const Tool* t : host.registry().tools()) {
    if (t->info.alias_of.empty()) all.push_back(t);
  }
  json tools = json::array();
  for (std::size_t i = from; i < all.size() && i < from + page_size_; ++i) {
    const Tool& t = *all[i];
    const ToolInfo& info = t.info;
    json entry = {{"name", info.aid}};
    if (!info.title.empty()) entry["title"] = info.title;
    entry["description"] = info.description;
    entry["inputSchema"] = advertised_input_schema(info);
    if (json output = advertised_output_schema(info); !output.is_null()) entry["outputSchema"] = output;
    entry["annotations"] = advertised_annotations(info);
    entry["_meta"] = {{"machina/name", info.name},
                      {"machina/tier", info.tier},
                      {"machina/timeout_ms", host.timeout_for(t, Request{})},
                      {"machina/runner", t.runner != nullptr ? std::string(t.runner->kind()) : std::string()}};
    tools.push_back(std::move(entry));
  }
  json result = {{"tools", tools}};
  if (from + page_size_ < all.size()) result["nextCursor"] = std::to_string(from + page_size_);
  std::string text = result.dump(-1, ' ', false, json::error_handler_t::replace);
  if (modern()) {
    text.pop_back();  // (the closing brace)
    text += ',';
    text += kModernCacheHints;
    text += R"(,"_meta":{)";
    text += server_info_stamp();
    text += "}}";
  }
  jsonrpc::append_result(out, id, text);
}

void McpSkillCodec::call(Host& host, const std::string& id, const jsonrpc::Message& m, CallerState& session,
                         std::string& out, OverrunSink* overrun_sink, Handled& handled) {
  Request request;
  std::string token, why;
  ErrorKind kind = ErrorKind::malformed_request;
  if (!read_call_params(m, request, token, why, kind)) return invalid_params(out, id, why, kind);
  // Any name of the tool (an unknown one: tool_not_found from the host).
  if (const Tool* tool = host.registry().resolve(request.aid)) request.aid = tool->info.aid;
  request.id_json = id;
  request.front = caller_ ? caller_->front : dialect_ == Dialect::mcp ? kMcpFront : kSkillFront;
  if (caller_) request.caller = caller_->identity;
  CancelToken cancel;
  std::optional<TokenProgress> progress;
  if (!token.empty() && dialect_ == Dialect::mcp) {
    progress.emplace(token, write_now_);
    request.progress = &*progress;
  }
  request.cancel = &cancel;
  {
    std::lock_guard lock(mu_);
    if (cancelled_.count(id) != 0) return;  // cancelled before it began: never run, never answered
    running_[id] = &cancel;
  }
  Response r = host.handle(request, session, overrun_sink);
  {
    std::lock_guard lock(mu_);
    running_.erase(id);
  }
  if (r.overran) {
    handled.overran = true;
    return;
  }
  if (cancel.cancelled()) return;  // a cancelled request is not answered
  encode_result(r, id, out);
}

void McpSkillCodec::encode(const Response& response, std::string& out) {
  if (!response.id_json.empty() && forget_if_cancelled(response.id_json)) return;
  encode_result(response, response.id_json.empty() ? std::string_view("null") : std::string_view(response.id_json),
                out);
}

void McpSkillCodec::encode_result(const Response& r, std::string_view id, std::string& out) const {
  append_call_result(r, id,
                     dialect_ == Dialect::skill ? ResultForm::skill
                     : modern()                 ? ResultForm::mcp_stamped
                                                : ResultForm::mcp,
                     out);
}

void McpSkillCodec::answer_too_large(Host& host, std::string_view head, std::string& out) {
  const std::string id = jsonrpc::find_id(head);
  const Response r = host.request_too_large();
  jsonrpc::append_error(out, id.empty() ? "null" : id, jsonrpc::kInvalidRequest, r.error, error_data(r.kind));
}

}  // namespace machina::cli
