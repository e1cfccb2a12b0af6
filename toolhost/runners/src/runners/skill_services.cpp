// See hosted_server.hpp: what a hosted server may ask of the host and be told. A skill's
// state/get and state/set reach the ds_state of its call in flight, data/read and
// data/write its data directory; ping is answered; anything else is refused (-32601).
// Progress notifications reach the caller of the call they name.
#include "hosted_server_protocol.hpp"
#include "remote_tool_output.hpp"

#include <machina/json_text.hpp>
#include <machina/runners/hosted_server.hpp>
#include <machina/workspace.hpp>

#include <unistd.h>

#include <optional>

namespace machina {
namespace {

using json = nlohmann::json;

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
  return {
      {"type", a.type}, {"content_json", a.content_json}, {"provenance", a.provenance}, {"size_bytes", a.size_bytes}};
}

}  // namespace

void HostedServer::on_request(const jsonrpc::Message& request, std::string& reply) {
  const std::string& m = request.method;
  if (m == "ping") return jsonrpc::append_result(reply, request.id, "{}");
  if (options_.dialect != HostedServerOptions::Dialect::mcp) {
    if (m == "state/get" || m == "state/set") return answer_state(request, reply);
    if (m == "data/read" || m == "data/write") return answer_data(request, reply);
  }
  // roots/list, sampling/createMessage, elicitation/create, ...: not offered.
  jsonrpc::append_error(reply, request.id, jsonrpc::kMethodNotFound, "Method not found",
                        json(m).dump(-1, ' ', false, json::error_handler_t::replace));
}

void HostedServer::answer_state(const jsonrpc::Message& request, std::string& reply) {
  const auto params = json::parse(request.params.empty() ? std::string_view("{}") : request.params, nullptr, false);
  if (!params.is_object())
    return jsonrpc::append_error(reply, request.id, jsonrpc::kInvalidParams, "params must be an object");
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
      if (slot < 0)
        return jsonrpc::append_error(reply, request.id, jsonrpc::kInvalidParams, "slot must be 0..7 or DS0..DS7");
      const auto& a = effective(slot);
      return jsonrpc::append_result(
          reply, request.id,
          json{{"slot", "DS" + std::to_string(slot)}, {"artifact", a ? artifact_json(*a) : json()}}.dump());
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
  if (slot < 0)
    return jsonrpc::append_error(reply, request.id, jsonrpc::kInvalidParams, "slot must be 0..7 or DS0..DS7");
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
    if (!validate_json(content))
      return jsonrpc::append_error(reply, request.id, jsonrpc::kInvalidParams, "content_json is not JSON");
  } else if (params.contains("content")) {
    content = params["content"].dump();
  } else {
    return jsonrpc::append_error(reply, request.id, jsonrpc::kInvalidParams,
                                 "give content (JSON) or content_json (text)");
  }
  const std::string type =
      params.contains("type") && params["type"].is_string() ? params["type"].get<std::string>() : "";
  const std::string provenance = params.contains("provenance") && params["provenance"].is_string()
                                     ? params["provenance"].get<std::string>()
                                     : "skill:" + options_.name;
  w.slots[slot] = Artifact{type, content, provenance, content.size()};
  w.set = static_cast<std::uint8_t>(w.set | bit);
  w.removed = static_cast<std::uint8_t>(w.removed & ~bit);
  jsonrpc::append_result(reply, request.id, R"({"ok":true})");
}

void HostedServer::answer_data(const jsonrpc::Message& request, std::string& reply) {
  const auto params = json::parse(request.params.empty() ? std::string_view("{}") : request.params, nullptr, false);
  if (!params.is_object() || !params.contains("path") || !params["path"].is_string())
    return jsonrpc::append_error(reply, request.id, jsonrpc::kInvalidParams, "params must name a path");
  std::vector<std::string> parts;
  std::string why;
  if (!workspace::split(params["path"].get<std::string>(), parts, why))
    return jsonrpc::append_error(reply, request.id, jsonrpc::kInvalidParams, "path refused: " + why);
  workspace::Workspace ws;
  if (!ws.open(options_.data_dir, why))
    return jsonrpc::append_error(reply, request.id, jsonrpc::kInternalError,
                                 "the data directory cannot be opened: " + why);
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
    return jsonrpc::append_result(reply, request.id,
                                  json{{"exists", true}, {"content", to_valid_utf8(content)}}.dump());
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

void HostedServer::on_notification(const jsonrpc::Message& notification) {
  if (notification.method != "notifications/progress") return;  // (log messages and list changes: not kept)
  const auto params =
      json::parse(notification.params.empty() ? std::string_view("{}") : notification.params, nullptr, false);
  if (!params.is_object() || !params.contains("progressToken") || !params.contains("progress") ||
      !params["progress"].is_number())
    return;
  const std::string token = remote_output::text_of(params["progressToken"]);
  std::lock_guard lock(mu_);
  auto it = by_token_.find(token);
  if (it == by_token_.end() || it->second->progress == nullptr) return;
  const double total = params.contains("total") && params["total"].is_number() ? params["total"].get<double>() : -1;
  const std::string message =
      params.contains("message") && params["message"].is_string() ? params["message"].get<std::string>() : "";
  it->second->progress->progress(params["progress"].get<double>(), total, message);
}

}  // namespace machina
