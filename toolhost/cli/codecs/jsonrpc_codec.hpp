// The JSON-RPC 2.0 fronts on stdio, one message per line: --mcp (an MCP server: initialize
// with version negotiation, tools/list, tools/call, ping, cancellation, progress) and
// --skill (a seed-001 skill: initialize with its tools, tools/call, lifecycle/*, shutdown).
// Both are codecs of the serving kit; every call goes through Host::handle like any other
// front's. See docs/jsonrpc.md.
#pragma once

#include "../serve_kit.hpp"

#include <machina/jsonrpc.hpp>

#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace machina::cli {

class JsonRpcCodec final : public LineCodec {
 public:
  enum class Dialect { mcp, skill };
  /// `page_size`: tools per tools/list page (MCP).
  explicit JsonRpcCodec(Dialect dialect, std::size_t page_size = 100);

  Handled handle(Host& host, std::string_view line, Session& session, std::string& out, Takeover* takeover) override;
  void answer_too_large(Host& host, std::string_view head, std::string& out) override;
  void encode(const Response& response, std::string& out) override;
  Peek peek(std::string_view line) override;
  void attach(WriteNow write_now) override { write_now_ = std::move(write_now); }

 private:
  void call(Host& host, const std::string& id, const jsonrpc::Message& m, Session& session, std::string& out,
            Takeover* takeover, Handled& handled);
  void initialize(Host& host, const std::string& id, std::string_view params, std::string& out);
  void list_tools(Host& host, const std::string& id, std::string_view params, std::string& out);
  void encode_result(const Response& r, std::string_view id, std::string& out) const;
  /// A cancellation of the request `id` (raw JSON): its call is stopped if it runs, or never
  /// started if it has not begun.
  void cancel(const std::string& id);
  bool forget_if_cancelled(const std::string& id);

  Dialect dialect_;
  std::size_t page_size_;
  WriteNow write_now_;
  std::mutex mu_;
  std::unordered_map<std::string, CancelToken*> running_;  // by raw id
  std::unordered_set<std::string> cancelled_;              // running calls cancelled, and ids cancelled before they ran
  std::deque<std::string> cancelled_order_;                // (oldest first: the set is bounded)
};

}  // namespace machina::cli
