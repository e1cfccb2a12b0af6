// RemoteMcpServer against a small Streamable HTTP server on loopback: the handshake's session
// sent with every later message, tools/list followed page by page, answers as event streams
// (CRLF lines, a notification before the response, data over several lines) or JSON bodies,
// the manifest's headers on every request, a session the server forgot opened again once,
// a JSON-RPC error as the tool's error, and the session ended at close.
#include <machina/call_context.hpp>
#include <machina/clock.hpp>
#include <machina/runners/remote_mcp_server.hpp>
#include <machina/tool.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "tiny_http_server.hpp"

#include <atomic>
#include <string>
#include <vector>

using namespace machina;
using machina::test::TinyServer;
using nlohmann::json;

namespace {

struct NoOverrun final : Overrun {
  void overrun() noexcept override {}
};

std::string answer(const std::string& head, const std::string& body) {
  return "HTTP/1.1 " + head + "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

/// The server's side: what it was asked, in order, and how it answers.
struct FakeMcp {
  std::mutex mu;
  std::vector<std::string> requests;  // every request, whole
  std::atomic<int> initializes{0};
  std::atomic<bool> forget_next_call{false};

  std::string respond(const std::string& request) {
    {
      std::lock_guard lock(mu);
      requests.push_back(request);
    }
    if (request.starts_with("DELETE ")) return answer("200 OK", "");
    const json m = json::parse(request.substr(request.find("\r\n\r\n") + 4));
    const std::string method = m.value("method", "");
    if (!m.contains("id")) return answer("202 Accepted", "");
    const json id = m["id"];
    auto result = [&](const json& r) { return json{{"jsonrpc", "2.0"}, {"id", id}, {"result", r}}.dump(); };
    const std::string session = "s" + std::to_string(initializes.load());
    if (method == "initialize") {
      const std::string opened = "s" + std::to_string(++initializes);
      const std::string events = "event: message\r\ndata: " +
                                 result({{"protocolVersion", "2025-11-25"},
                                         {"capabilities", json::object()},
                                         {"serverInfo", {{"name", "fake"}, {"version", "1"}}}}) +
                                 "\r\n\r\n";
      return answer("200 OK\r\nContent-Type: text/event-stream\r\nMcp-Session-Id: " + opened, events);
    }
    if (request.find("Mcp-Session-Id: " + session + "\r\n") == std::string::npos) return answer("400 Bad Request", "");
    if (method == "tools/list") {
      const bool second = m["params"].contains("cursor");
      json page = {{"tools", json::array({{{"name", second ? "two" : "one"}, {"inputSchema", {{"type", "object"}}}}})}};
      if (!second) page["nextCursor"] = "2";
      return answer("200 OK\r\nContent-Type: application/json", result(page));
    }
    if (method == "tools/call") {
      if (forget_next_call.exchange(false)) return answer("404 Not Found", "");
      if (m["params"]["name"] == "two")
        return answer(
            "200 OK\r\nContent-Type: application/json",
            json{{"jsonrpc", "2.0"}, {"id", id}, {"error", {{"code", -32000}, {"message", "no two"}}}}.dump());
      // A progress notification, then the response with its data over two lines.
      const std::string text = result({{"content", json::array()}, {"structuredContent", m["params"]["arguments"]}});
      const std::size_t cut = text.find(",\"result\"");
      return answer("200 OK\r\nContent-Type: text/event-stream",
                    "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n: a comment\n"
                    "data: " +
                        text.substr(0, cut) + "\ndata: " + text.substr(cut) + "\n\n");
    }
    return answer("200 OK\r\nContent-Type: application/json",
                  json{{"jsonrpc", "2.0"}, {"id", id}, {"error", {{"code", -32601}, {"message", "?"}}}}.dump());
  }
};

struct Ran {
  RunOutcome outcome;
  std::string output, error;
};

Ran run(RemoteMcpServer& server, const std::string& tool, const std::string& input) {
  NoOverrun no_overrun;
  Tool t{CircuitBreaker::Options{}};
  t.info.aid = "AID.UNIT.REMOTE.v1";
  CallContext ctx(1 << 20, std::make_shared<const Slots>());
  const RunSpec spec{t, input, steady_now_ms() + 10'000, 10'000, ctx, &no_overrun};
  Ran r;
  r.outcome = server.call(spec, tool);
  r.output = ctx.output;
  r.error = ctx.error;
  return r;
}

}  // namespace

TEST_CASE("a remote MCP server's session, tools, calls and end, over event streams and JSON bodies") {
  FakeMcp fake;
  TinyServer http([&](const std::string& request) { return fake.respond(request); });
  RemoteMcpOptions o;
  o.name = "fake";
  o.url = "http://127.0.0.1:" + std::to_string(http.port) + "/mcp";
  o.headers = {{"Authorization", "Bearer unit"}};
  RemoteMcpServer server(o);
  const std::vector<RemoteTool> tools = server.start();
  REQUIRE(tools.size() == 2);
  CHECK(tools[0].name == "one");
  CHECK(tools[1].name == "two");

  const Ran one = run(server, "one", R"({"k":1})");
  CHECK(one.outcome.ending == RunOutcome::Ending::ran);
  CHECK(one.outcome.rc == MACHINA_TOOL_OK);
  CHECK(json::parse(one.output) == json{{"k", 1}});

  const Ran two = run(server, "two", "{}");
  CHECK(two.outcome.rc == MACHINA_TOOL_ERROR);
  CHECK(two.error == "error -32000: no two");

  fake.forget_next_call = true;  // the server ends the session: a new one, and the call again
  const Ran again = run(server, "one", R"({"k":2})");
  CHECK(again.outcome.rc == MACHINA_TOOL_OK);
  CHECK(json::parse(again.output) == json{{"k", 2}});
  CHECK(fake.initializes == 2);

  server.close();
  std::lock_guard lock(fake.mu);
  REQUIRE(!fake.requests.empty());
  CHECK(fake.requests.back().starts_with("DELETE /mcp HTTP/1.1\r\n"));
  CHECK(fake.requests.back().find("Mcp-Session-Id: s2\r\n") != std::string::npos);
  for (const std::string& r : fake.requests) {
    CHECK(r.find("Authorization: Bearer unit\r\n") != std::string::npos);
    CHECK(r.find("Accept: application/json, text/event-stream\r\n") != std::string::npos);
  }
}

TEST_CASE("a remote MCP server that is not there, or refuses, is named at start") {
  TinyServer refusing(std::string("HTTP/1.1 401 Unauthorized\r\nContent-Length: 6\r\n\r\nno way"));
  RemoteMcpOptions o;
  o.name = "refusing";
  o.url = "http://127.0.0.1:" + std::to_string(refusing.port) + "/mcp";
  o.start_timeout_ms = 5'000;
  RemoteMcpServer server(o);
  try {
    server.start();
    FAIL("start() succeeded");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()).find("initialize failed: it answered HTTP 401 (no way)") != std::string::npos);
  }
  RemoteMcpOptions bad;
  bad.url = "ftp://example/mcp";
  CHECK_THROWS_AS(RemoteMcpServer{bad}, ConfigError);
}
