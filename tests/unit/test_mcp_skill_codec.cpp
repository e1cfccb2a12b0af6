// The JSON-RPC stdio fronts' codec, line by line: MCP's version agreement, tool list pages
// and calls, the answers to bad lines, a cancellation that comes before its call, and the
// skill dialect's initialize and shutdown.
#include "../../toolhost/cli/codecs/mcp_skill_codec.hpp"
#include "echo_tools.hpp"

#include <machina/tool_host.hpp>

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <string>

using namespace machina;
using nlohmann::json;
using Codec = cli::McpSkillCodec;

namespace {

/// A host with two echo tools, and a codec of `dialect` speaking for one connection.
struct Front {
  explicit Front(Codec::Dialect dialect, std::size_t page_size = 100)
      : tools(HostOptions{}), codec(dialect, page_size) {
    tools.add_linked_plugin(test::echo_tools());
  }
  /// The codec's answer to `line` (null when it wrote none).
  json answer(const std::string& line) {
    std::string out;
    last = codec.handle(tools.host(), line, session, out, nullptr);
    if (out.empty()) return nullptr;
    REQUIRE(out.back() == '\n');
    return json::parse(out);
  }
  ToolHost tools;
  Codec codec;
  CallerState session{true};
  cli::LineCodec::Handled last;
};

}  // namespace

TEST_CASE("MCP initialize agrees on a revision the client names, else offers the latest") {
  Front f(Codec::Dialect::mcp);
  const json known =
      f.answer(R"({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26"}})");
  CHECK(known.at("result").at("protocolVersion") == "2025-03-26");
  CHECK(known.at("result").at("capabilities").at("tools").at("listChanged") == false);
  Front g(Codec::Dialect::mcp);
  const json unknown =
      g.answer(R"({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"1999-01-01"}})");
  CHECK(unknown.at("result").at("protocolVersion") == "2025-11-25");
}

TEST_CASE("MCP tools/list comes in pages, and a cursor it never gave is refused") {
  Front f(Codec::Dialect::mcp, /*page_size=*/1);
  f.answer(R"({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25"}})");
  const json first = f.answer(R"({"jsonrpc":"2.0","id":1,"method":"tools/list"})");
  REQUIRE(first.at("result").at("tools").size() == 1);
  const std::string cursor = first.at("result").at("nextCursor");
  const json second =
      f.answer(R"({"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"cursor":")" + cursor + "\"}}");
  REQUIRE(second.at("result").at("tools").size() == 1);
  CHECK_FALSE(second.at("result").contains("nextCursor"));
  CHECK(first.at("result").at("tools")[0].at("name") != second.at("result").at("tools")[0].at("name"));
  const json bad = f.answer(R"({"jsonrpc":"2.0","id":3,"method":"tools/list","params":{"cursor":"soon"}})");
  CHECK(bad.at("error").at("code") == -32602);
}

TEST_CASE("MCP tools/call runs the tool through the host, and an unknown tool is an invalid-params error") {
  Front f(Codec::Dialect::mcp);
  const json ran = f.answer(
      R"({"jsonrpc":"2.0","id":"c1","method":"tools/call","params":{"name":"AID.UNIT.ECHO.v1","arguments":{"n":1}}})");
  CHECK(ran.at("id") == "c1");
  CHECK(ran.at("result").at("isError") == false);
  CHECK(ran.at("result").at("structuredContent") == json{{"n", 1}});
  CHECK(json::parse(ran.at("result").at("content")[0].at("text").get<std::string>()) == json{{"n", 1}});
  CHECK(f.last.has_id);
  const json unknown = f.answer(
      R"({"jsonrpc":"2.0","id":"c2","method":"tools/call","params":{"name":"AID.UNIT.ECHO.v2","arguments":{}}})");
  CHECK(unknown.at("id") == "c2");
  CHECK(unknown.at("error").at("code") == -32602);
  CHECK(unknown.at("error").at("message").get<std::string>().find("tool not found") != std::string::npos);
}

TEST_CASE("bad lines are answered by JSON-RPC's errors, and a notification gets no answer") {
  Front f(Codec::Dialect::mcp);
  const json garbage = f.answer("{not json");
  CHECK(garbage.at("id").is_null());
  CHECK(garbage.at("error").at("code") == -32700);
  const json fraction = f.answer(R"({"jsonrpc":"2.0","id":1.5,"method":"ping"})");
  CHECK(fraction.at("id").is_null());
  CHECK(fraction.at("error").at("code") == -32600);
  const json unknown = f.answer(R"({"jsonrpc":"2.0","id":2,"method":"no/such"})");
  CHECK(unknown.at("error").at("code") == -32601);
  CHECK(f.answer(R"({"jsonrpc":"2.0","method":"notifications/initialized"})").is_null());
  CHECK(f.answer(R"({"jsonrpc":"2.0","id":3,"method":"ping"})").at("result") == json::object());
}

TEST_CASE("a call cancelled before it begins is never run and never answered") {
  Front f(Codec::Dialect::mcp);
  const std::string cancel = R"({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}})";
  CHECK(f.codec.peek(cancel) == cli::LineCodec::Peek::done);
  CHECK(f.answer(R"({"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"AID.UNIT.ECHO.v1"}})").is_null());
  CHECK(f.tools.host().stats().calls == 0);
  CHECK_FALSE(
      f.answer(R"({"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"AID.UNIT.ECHO.v1"}})").is_null());
  CHECK(f.tools.host().stats().calls == 1);  // (the host counts the calls it runs)
}

TEST_CASE("a skill's initialize names its tools, and shutdown is read last and answered after the rest") {
  Front f(Codec::Dialect::skill);
  const json init = f.answer(R"({"jsonrpc":"2.0","id":1,"method":"initialize","params":{}})");
  CHECK(init.at("result").at("tools").size() == 2);
  CHECK(init.at("result").at("tools")[0].contains("parameters"));
  const std::string shutdown = R"({"jsonrpc":"2.0","id":2,"method":"shutdown"})";
  CHECK(f.codec.peek(shutdown) == cli::LineCodec::Peek::handle_then_stop);
  CHECK(f.answer(shutdown).at("result") == json{{"ok", true}});
  CHECK_FALSE(f.last.has_id);  // (it waits for every earlier answer)
  const json ran = f.answer(
      R"({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"AID.UNIT.ECHO.v1","arguments":{"n":2}}})");
  CHECK(ran.at("result").at("content") == json(json{{"n", 2}}.dump()));  // a skill's content: a string
}
