// Nesting past kMaxJsonDepth is refused by every SAX reader that takes JSON from outside
// the host (MCP and skill fronts, hosted children, Python tool answers, the wire client):
// RapidJSON's reader recurses, so a line of a few hundred kilobytes of brackets would
// otherwise overflow the stack (it did: `--mcp` died on SIGSEGV).
#include <machina/json_text.hpp>
#include <machina/jsonrpc.hpp>
#include <machina/ndjson_client.hpp>
#include <machina/tool_protocol.hpp>

#include <doctest/doctest.h>

#include <string>

using namespace machina;

namespace {
std::string nested(std::size_t depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}
constexpr std::size_t kDeep = 200'000;
const std::string kTooDeep = "nesting deeper than " + std::to_string(kMaxJsonDepth);
}  // namespace

TEST_CASE("a JSON-RPC message nested past the limit is a parse error, not a crash") {
  jsonrpc::Message m;
  std::string why;
  CHECK_FALSE(jsonrpc::parse(nested(kDeep), m, why));
  CHECK(why.find(kTooDeep) != std::string::npos);
  const std::string call =
      R"({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"a":)" + nested(kDeep) + "}}}";
  why.clear();
  CHECK_FALSE(jsonrpc::parse(call, m, why));
  CHECK(why.find(kTooDeep) != std::string::npos);
  // Within the limit (the message itself, params and arguments take three levels).
  const std::string fine = R"({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"a":)" +
                           nested(kMaxJsonDepth - 4) + "}}}";
  REQUIRE(jsonrpc::parse(fine, m, why));
  CHECK(m.kind == jsonrpc::Message::Kind::request);
}

TEST_CASE("members and elements of a value nested past the limit are refused") {
  std::string why;
  int seen = 0;
  auto count = [&](const jsonrpc::Member&) { return ++seen, true; };
  CHECK_FALSE(jsonrpc::for_each_member("{\"a\":" + nested(kDeep) + "}", count, why));
  CHECK(why.find(kTooDeep) != std::string::npos);
  why.clear();
  CHECK_FALSE(jsonrpc::for_each_element(nested(kDeep), count, why));
  CHECK(why.find(kTooDeep) != std::string::npos);
  CHECK(jsonrpc::find_id("{\"x\":" + nested(kDeep) + ",\"id\":3}").empty());  // (the id comes after: not reached)
}

TEST_CASE("a tool answer nested past the limit is refused with the reason") {
  tool_protocol::Answer a;
  std::string why;
  CHECK_FALSE(tool_protocol::decode_answer("{\"ok\":true,\"result\":" + nested(kDeep) + "}", a, why));
  CHECK(why == kTooDeep);
  REQUIRE(tool_protocol::decode_answer("{\"ok\":true,\"result\":" + nested(kMaxJsonDepth - 1) + "}", a, why));
  CHECK(a.result.size() == 2 * (kMaxJsonDepth - 1));
}

TEST_CASE("a host response nested past the limit is refused by the wire client") {
  ResponseFields f;
  std::string why;
  CHECK_FALSE(decode_response("{\"ok\":true,\"x\":" + nested(kDeep) + "}", f, why));
  CHECK(why.find(kTooDeep) != std::string::npos);
  REQUIRE(decode_response("{\"ok\":true,\"x\":" + nested(16) + "}", f, why));
  CHECK(f.ok);
}
