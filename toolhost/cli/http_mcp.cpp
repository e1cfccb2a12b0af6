// See http_mcp.hpp.
#include "http_mcp.hpp"

#include "codecs/mcp_skill_codec.hpp"

#include <machina/jsonrpc.hpp>
#include <machina/random_text.hpp>

#include <atomic>

namespace machina::cli {
namespace {

constexpr FrontLabel kMcpHttpFront{"mcp-http", /*local_caller=*/false};  // (a network peer)
using Clock = std::chrono::steady_clock;

/// 32 random hex digits.
std::string new_session_id() {
  return random_text("0123456789abcdef", 32);
}

/// The answer for the lines a codec wrote: one JSON body, or 202 with none; a message that
/// could not be read (a JSON-RPC error without an id) is a 400.
HttpReply answer_of(std::string out) {
  while (!out.empty() && out.back() == '\n') out.pop_back();
  if (out.empty()) return {202, {}, {}};
  jsonrpc::Message m;
  std::string why;
  const bool unread =
      jsonrpc::parse(out, m, why) && m.kind == jsonrpc::Message::Kind::error && (m.id.empty() || m.id == "null");
  return {unread ? 400u : 200u, std::move(out), {}};
}

/// Whether the codec's answer to an initialize is a result (not an error).
bool initialized(const std::string& answer) {
  jsonrpc::Message m;
  std::string why;
  return jsonrpc::parse(answer, m, why) && m.kind == jsonrpc::Message::Kind::result;
}

/// The codec's answer to a call at its deadline, handed to the HTTP connection.
class LateSink final : public OverrunSink {
 public:
  LateSink(McpSkillCodec& codec, const McpOverHttp::LateAnswer& late) : codec_(codec), late_(late) {}
  void deliver(Response response) override {
    std::string out;
    codec_.encode(response, out);
    while (!out.empty() && out.back() == '\n') out.pop_back();
    late_(std::move(out));
  }

 private:
  McpSkillCodec& codec_;
  const McpOverHttp::LateAnswer& late_;
};

}  // namespace

struct McpOverHttp::Session {
  Session(std::size_t page_size, const std::string& caller_)
      : caller(caller_), codec(McpSkillCodec::Dialect::mcp, page_size, McpSkillCodec::Caller{kMcpHttpFront, caller_}) {}
  std::string caller;  // who opened it: only they use it
  McpSkillCodec codec;
  CallerState state{/*respond_with_delta=*/true};
  std::atomic<Clock::rep> last_used{Clock::now().time_since_epoch().count()};
};

McpOverHttp::McpOverHttp(Host& host, std::size_t page_size, std::size_t max_sessions)
    : host_(host), page_size_(page_size), max_sessions_(max_sessions) {}

McpOverHttp::~McpOverHttp() {
  for (const auto& [id, session] : sessions_) host_.connection_closed(id);
}

std::size_t McpOverHttp::sessions() const {
  std::lock_guard lock(mu_);
  return sessions_.size();
}

bool McpOverHttp::keep_session(std::shared_ptr<Session> session, std::string& id, std::string& ended) {
  std::lock_guard lock(mu_);
  if (sessions_.size() >= max_sessions_) {
    // Room is made by the session used longest ago among those no request is using.
    auto oldest = sessions_.end();
    for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
      if (it->second.use_count() != 1) continue;
      if (oldest == sessions_.end() || it->second->last_used < oldest->second->last_used) oldest = it;
    }
    if (oldest == sessions_.end()) return false;
    ended = oldest->first;
    sessions_.erase(oldest);
  }
  do {
    id = new_session_id();
  } while (sessions_.contains(id));
  sessions_.emplace(id, std::move(session));
  return true;
}

HttpReply McpOverHttp::post(std::string_view session_id, const std::string& body, const std::string& caller,
                            const LateAnswer& late) {
  std::shared_ptr<Session> session;
  bool opening = false;
  if (!session_id.empty()) {
    std::lock_guard lock(mu_);
    const auto it = sessions_.find(std::string(session_id));
    if (it == sessions_.end() || it->second->caller != caller)
      return {
          404, refusal("session_not_found", "no such MCP session (ended, or never opened): initialize a new one"), {}};
    session = it->second;
  } else {
    jsonrpc::Message m;
    std::string why;
    opening = jsonrpc::parse(body, m, why) && m.method == "initialize" && !m.id.empty();
    if (opening) session = std::make_shared<Session>(page_size_, caller);  // (kept once it answers a result)
  }
  // A message outside a session: a codec of its own, for this message alone.
  std::optional<Session> alone;
  Session& s = session ? *session : alone.emplace(page_size_, caller);
  s.last_used = Clock::now().time_since_epoch().count();
  std::string out;
  if (s.codec.peek(body) == LineCodec::Peek::done) return {202, {}, {}};  // a cancellation
  LateSink sink(s.codec, late);
  if (s.codec.handle(host_, body, s.state, out, &sink).overran) return {0, {}, {}};
  HttpReply reply = answer_of(std::move(out));
  if (opening && reply.status == 200 && initialized(reply.body)) {
    std::string id, ended;
    if (!keep_session(std::move(session), id, ended))
      return {503, refusal("overloaded", "too many MCP sessions in use (" + std::to_string(max_sessions_) + ")"), {}};
    if (!ended.empty()) host_.connection_closed(ended);
    host_.connection_opened(id);
    reply.headers.emplace_back(kMcpSessionHeader, id);
  }
  return reply;
}

HttpReply McpOverHttp::end(std::string_view session_id, const std::string& caller) {
  {
    std::lock_guard lock(mu_);
    const auto it = sessions_.find(std::string(session_id));
    if (it == sessions_.end() || it->second->caller != caller)
      return {404, refusal("session_not_found", "no such MCP session"), {}};
    sessions_.erase(it);
  }
  host_.connection_closed(std::string(session_id));
  return {204, {}, {}};
}

}  // namespace machina::cli
