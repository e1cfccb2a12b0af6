// MCP over Streamable HTTP without sockets: an initialize answered with a result opens a
// session named in its answer's header (a failed one opens none), a notification is 202 with
// no body, a message outside a session is served on its own, an unreadable one is 400, a
// session is its caller's alone, an ended or unknown session is 404, and at the cap the least
// recently used session makes room.
#include "../../toolhost/cli/http_mcp.hpp"
#include "echo_tools.hpp"

#include <machina/tool_host.hpp>

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <string>

using namespace machina;
using nlohmann::json;

namespace {

const std::string kInitialize =
    R"({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",)"
    R"("capabilities":{},"clientInfo":{"name":"unit","version":"0"}}})";
const std::string kPing = R"({"jsonrpc":"2.0","id":2,"method":"ping"})";

struct Mcp {
  ToolHost tools{HostOptions{}};
  cli::McpOverHttp mcp;
  const cli::McpOverHttp::LateAnswer late = [](std::string) {};
  explicit Mcp(std::size_t max_sessions) : mcp(tools.host(), 100, max_sessions) {
    tools.add_linked_plugin(test::echo_tools());
  }
  cli::HttpReply post(const std::string& session, const std::string& body) {
    return mcp.post(session, body, "peer:127.0.0.1", late);
  }
  std::string open() {
    const cli::HttpReply r = post("", kInitialize);
    REQUIRE(r.status == 200);
    REQUIRE(r.headers.size() == 1);
    CHECK(r.headers[0].first == cli::kMcpSessionHeader);
    return r.headers[0].second;
  }
};

}  // namespace

TEST_CASE("an MCP session over HTTP is opened, used, and ended") {
  Mcp m(8);
  const std::string id = m.open();
  CHECK(id.size() == 32);
  CHECK(m.mcp.sessions() == 1);
  const cli::HttpReply note = m.post(id, R"({"jsonrpc":"2.0","method":"notifications/initialized"})");
  CHECK(note.status == 202);
  CHECK(note.body.empty());
  const cli::HttpReply call =
      m.post(id, R"({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"AID.UNIT.ECHO.v1",)"
                 R"("arguments":{"k":1}}})");
  CHECK(call.status == 200);
  CHECK(json::parse(call.body).at("result").at("structuredContent") == json{{"k", 1}});
  CHECK(m.mcp.end(id, "peer:127.0.0.1").status == 204);
  CHECK(m.mcp.sessions() == 0);
  CHECK(m.post(id, kPing).status == 404);
  CHECK(m.mcp.end(id, "peer:127.0.0.1").status == 404);
  CHECK(m.post("no-such-session", kPing).status == 404);
}

TEST_CASE("an MCP message outside a session is served on its own and opens none") {
  Mcp m(8);
  const cli::HttpReply r = m.post("", kPing);
  CHECK(r.status == 200);
  CHECK(r.headers.empty());
  CHECK(json::parse(r.body).at("id") == 2);
  CHECK(m.mcp.sessions() == 0);
}

TEST_CASE("at the cap, the least recently used MCP session makes room") {
  Mcp m(2);
  const std::string a = m.open();
  const std::string b = m.open();
  CHECK(m.post(a, kPing).status == 200);  // a: used after b
  const std::string c = m.open();
  CHECK(m.mcp.sessions() == 2);
  CHECK(m.post(b, kPing).status == 404);
  CHECK(m.post(a, kPing).status == 200);
  CHECK(m.post(c, kPing).status == 200);
}

TEST_CASE("a failed MCP initialize opens no session, and a session is its caller's alone") {
  Mcp m(8);
  const cli::HttpReply failed = m.post("", R"({"jsonrpc":"2.0","id":1.5,"method":"initialize","params":{}})");
  CHECK(failed.headers.empty());
  CHECK(m.mcp.sessions() == 0);
  const std::string id = m.open();
  CHECK(m.mcp.post(id, kPing, "peer:10.0.0.9", m.late).status == 404);
  CHECK(m.mcp.end(id, "peer:10.0.0.9").status == 404);
  CHECK(m.post(id, kPing).status == 200);
}

TEST_CASE("an unreadable MCP message is a 400, and a method name that is not UTF-8 is answered") {
  Mcp m(8);
  const cli::HttpReply unread = m.post("", "{nope");
  CHECK(unread.status == 400);
  CHECK(json::parse(unread.body).at("error").at("code") == -32700);
  const cli::HttpReply odd = m.post("", "{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"\xff\"}");
  CHECK(odd.status == 200);
  CHECK(json::parse(odd.body).at("error").at("code") == -32601);
}
