// The JSON-RPC 2.0 fronts on stdio, one message per line: --mcp (an MCP server: the
// handshake revisions — initialize with version negotiation, tools/list, tools/call, ping —
// and the 2026-07-28 revision — server/discover, each request carrying its protocol version
// in `_meta`, no session — the connection's first request choosing, with cancellation and
// progress in both) and --skill (a skill of the lifecycle/* layout: initialize with its
// tools, tools/call, lifecycle/*, shutdown). Both are codecs of the line server; every call
// goes through Host::handle like any other front's. One codec serves one connection. See
// docs/mcp-and-skills.md.
#pragma once

#include "../line_server.hpp"

#include <machina/jsonrpc.hpp>

#include <atomic>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace machina::cli {

class McpSkillCodec final : public LineCodec {
 public:
  enum class Dialect { mcp, skill };
  /// Who calls through a codec that does not serve this process's standard streams: the
  /// front's label and the caller's identity (for the audit store).
  struct Caller {
    FrontLabel front;
    std::string identity;
  };
  /// `page_size`: tools per tools/list page (MCP). `caller`: none for a stdio front.
  explicit McpSkillCodec(Dialect dialect, std::size_t page_size = 100, std::optional<Caller> caller = std::nullopt);

  /// Whether `version` is an MCP revision this codec speaks.
  static bool serves_version(std::string_view version);

  Handled handle(Host& host, std::string_view line, CallerState& session, std::string& out,
                 OverrunSink* overrun_sink) override;
  void answer_too_large(Host& host, std::string_view head, std::string& out) override;
  void encode(const Response& response, std::string& out) override;
  Peek peek(std::string_view line) override;
  void attach(WriteNow write_now) override { write_now_ = std::move(write_now); }

 private:
  /// The MCP revisions a connection is served at: chosen once, by its first request (one
  /// carrying the 2026-07-28 `_meta` envelope, initialize aside, opens a 2026-07-28
  /// connection; any other a handshake one).
  enum class Era { open, handshake, modern };
  Era settle_era(const jsonrpc::Message& m);
  void call(Host& host, const std::string& id, const jsonrpc::Message& m, CallerState& session, std::string& out,
            OverrunSink* overrun_sink, Handled& handled);
  /// A request on a 2026-07-28 connection: its envelope checked, then served.
  void serve_modern(Host& host, const std::string& id, const jsonrpc::Message& m, CallerState& session,
                    std::string& out, OverrunSink* overrun_sink, Handled& handled);
  void initialize(Host& host, const std::string& id, std::string_view params, std::string& out);
  void list_tools(Host& host, const std::string& id, std::string_view params, std::string& out);
  bool modern() const { return era_.load(std::memory_order_acquire) == Era::modern; }
  void encode_result(const Response& r, std::string_view id, std::string& out) const;
  /// A cancellation of the request `id` (raw JSON): its call is stopped if it runs, or never
  /// started if it has not begun.
  void cancel(const std::string& id);
  bool forget_if_cancelled(const std::string& id);

  Dialect dialect_;
  std::size_t page_size_;
  std::optional<Caller> caller_;
  WriteNow write_now_;
  std::atomic<Era> era_{Era::open};
  std::mutex mu_;
  std::unordered_map<std::string, CancelToken*> running_;  // by raw id
  std::unordered_set<std::string> cancelled_;              // running calls cancelled, and ids cancelled before they ran
  std::deque<std::string> cancelled_order_;                // (oldest first: the set is bounded)
};

}  // namespace machina::cli
