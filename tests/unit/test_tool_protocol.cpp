// Tool protocol v1 as the runners speak it (tool_protocol.hpp): the calls they send and
// the answers they accept, including the ones they must refuse.
#include <machina/tool_protocol.hpp>

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <set>

using namespace machina::tool_protocol;

TEST_CASE("the local call carries the tool protocol's fields, the payload as it is") {
  std::string out;
  encode_local_call({"greeter", "tools.sample_tool:greet", R"({"name": "Ada"})", true, "t-1",
                     R"({"guarantees":{"no_network":true}})", 1234},
                    out);
  const auto j = nlohmann::json::parse(out);
  CHECK(j == nlohmann::json{{"protocol_version", 1},
                            {"tool", "greeter"},
                            {"entry", "tools.sample_tool:greet"},
                            {"payload", {{"name", "Ada"}}},
                            {"sandbox", true},
                            {"trace_id", "t-1"},
                            {"capability_context", {{"guarantees", {{"no_network", true}}}}},
                            {"deadline_monotonic_ms", 1234}});
  CHECK(out.find(R"("payload":{"name": "Ada"})") != std::string::npos);  // not re-encoded
}

TEST_CASE("the service call carries the tool protocol's service fields") {
  std::string out;
  encode_service_call({"greeter", "", "[1]", false, "t-2", {}}, 2500, "/apps/demo", out);
  CHECK(nlohmann::json::parse(out) == nlohmann::json{{"protocol_version", 1},
                                                     {"tool_name", "greeter"},
                                                     {"kind", "python"},
                                                     {"entry", ""},
                                                     {"payload", {1}},
                                                     {"timeout_ms", 2500},
                                                     {"trace_id", "t-2"},
                                                     {"project", {{"app_root", "/apps/demo"}, {"flow", ""}}}});
}

TEST_CASE("an answer's result and trace are cut out as they were written") {
  Answer a;
  std::string why;
  REQUIRE(
      decode_answer(R"({"ok": true, "protocol_version": 1, "result":  {"a": [1, 2.50]} , "trace": {"x": 1}})", a, why));
  CHECK(a.ok);
  CHECK(a.result == R"({"a": [1, 2.50]})");
  CHECK(a.trace == R"({"x": 1})");
  REQUIRE(decode_answer(R"({"trace": {}, "result": "text", "ok": true})", a, why));
  CHECK(a.result == R"("text")");
  REQUIRE(decode_answer(R"({"ok": true})", a, why));
  CHECK(a.result == "null");
  REQUIRE(decode_answer(R"({"ok": true, "result": -1.5e3})", a, why));
  CHECK(a.result == "-1.5e3");
}

TEST_CASE("an error answer gives its type, message and reason code") {
  Answer a;
  std::string why;
  REQUIRE(decode_answer(R"({"ok": false, "error": {"type": "ValueError", "message": "Missing input",
                             "reason_code": "guarantee_blocked", "extra": [1]}})",
                        a, why));
  CHECK(!a.ok);
  CHECK(a.error_type == "ValueError");
  CHECK(a.error_message == "Missing input");
  CHECK(a.reason_code == "guarantee_blocked");
  REQUIRE(decode_answer(R"({"ok": false, "error": {"message": "no type"}})", a, why));
  CHECK(a.error_type == "ToolError");  // as the original names an untyped error
  REQUIRE(decode_answer(R"({"ok": false, "error": "a bare message"})", a, why));
  CHECK((a.error_type == "ToolError" && a.error_message == "a bare message"));
}

TEST_CASE("what is not an answer is refused with a reason") {
  Answer a;
  std::string why;
  for (const char* bad : {"", "not json", "[1, 2]", "42", R"({"result": 1})", R"({"ok": "yes"})", R"({"ok": [true]})",
                          R"({"ok": true, "result": })"}) {
    CAPTURE(bad);
    CHECK_FALSE(decode_answer(bad, a, why));
    CHECK_FALSE(why.empty());
  }
}

TEST_CASE("trace ids are fresh version-4 UUIDs") {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    const std::string id = new_trace_id();
    REQUIRE(id.size() == 36);
    CHECK(id[14] == '4');
    CHECK((id[19] == '8' || id[19] == '9' || id[19] == 'a' || id[19] == 'b'));
    seen.insert(id);
  }
  CHECK(seen.size() == 100);
}
