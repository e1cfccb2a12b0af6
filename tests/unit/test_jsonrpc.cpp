// JSON-RPC 2.0 lines (jsonrpc.hpp): every kind of message read with its raw parts, what is
// not a message told apart from what is not JSON, and the lines written back.
#include <machina/json_text.hpp>
#include <machina/jsonrpc.hpp>

#include <doctest/doctest.h>

#include "string_cases.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>

using namespace machina::jsonrpc;

namespace {
Message read(std::string_view line) {
  Message m;
  std::string why;
  REQUIRE(parse(line, m, why));
  return m;
}
}  // namespace

TEST_CASE("requests, notifications, results and errors are told apart, their parts raw") {
  Message m = read(R"({"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x","arguments":{"a":[1, 2]}}})");
  CHECK(m.kind == Message::Kind::request);
  CHECK(m.id == "7");
  CHECK(m.method == "tools/call");
  CHECK(m.params == R"({"name":"x","arguments":{"a":[1, 2]}})");
  m = read(R"({"method":"notifications/cancelled","jsonrpc":"2.0","params":{"requestId":"a"}})");
  CHECK(m.kind == Message::Kind::notification);
  CHECK(m.id.empty());
  m = read(R"({"jsonrpc":"2.0","id":"s-1","result":{"ok":true}})");
  CHECK((m.kind == Message::Kind::result && m.id == R"("s-1")" && m.result == R"({"ok":true})"));
  m = read(R"({"jsonrpc":"2.0","id":3,"result":  null })");
  CHECK((m.kind == Message::Kind::result && m.result == "null"));
  m = read(R"({"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error","data":{"at":[1]}}})");
  CHECK(m.kind == Message::Kind::error);
  CHECK(m.id == "null");
  CHECK(m.error_code == -32700);
  CHECK(m.error_message == "Parse error");
  CHECK(m.error_data == R"({"at":[1]})");
  // Numbers and strings read in place keep their own text, blanks around them or not.
  m = read(R"({"jsonrpc":"2.0","id": 12 ,"error":{"message": "a\b" ,"code" :  -7 , "data": -0.5e1 }})");
  CHECK((m.kind == Message::Kind::error && m.id == "12" && m.error_code == -7 && m.error_message == "a\b"));
  CHECK(m.error_data == "-0.5e1");
}

TEST_CASE("what is not a message is refused, and why") {
  for (const char* bad :
       {R"([{"jsonrpc":"2.0","method":"a"}])", R"({"id":1,"method":"a"})", R"({"jsonrpc":"1.0","id":1,"method":"a"})",
        R"({"jsonrpc":"2.0","id":true,"method":"a"})", R"({"jsonrpc":"2.0","id":null,"method":"a"})",
        R"({"jsonrpc":"2.0","id":1})", R"({"jsonrpc":"2.0","id":1,"result":1,"error":{"code":1,"message":"x"}})",
        R"({"jsonrpc":"2.0","id":1,"error":{"message":"no code"}})", R"({"jsonrpc":"2.0","method":"a","params":5})",
        "42", R"("text")"}) {
    CAPTURE(bad);
    Message m;
    std::string why;
    REQUIRE(parse(bad, m, why));
    CHECK(m.kind == Message::Kind::invalid);
    CHECK_FALSE(m.why.empty());
  }
  for (const char* not_json : {"", "{", "{\"jsonrpc\":\"2.0\"} tail", "nope"}) {
    CAPTURE(not_json);
    Message m;
    std::string why;
    CHECK_FALSE(parse(not_json, m, why));
    CHECK(why.find("not JSON") != std::string::npos);
  }
}

TEST_CASE("lines written back are JSON-RPC 2.0 and carry their raw parts as they are") {
  std::string out;
  append_request(out, "5", "tools/call", R"({"name":"é"})");
  append_notification(out, "notifications/initialized", "");
  append_result(out, R"("a")", R"({"x":1})");
  append_error(out, "", kMethodNotFound, "Method not found", R"("foo")");
  std::vector<nlohmann::json> lines;
  std::size_t at = 0;
  for (std::size_t nl; (nl = out.find('\n', at)) != std::string::npos; at = nl + 1)
    lines.push_back(nlohmann::json::parse(out.substr(at, nl - at)));
  REQUIRE(lines.size() == 4);
  CHECK(lines[0] ==
        nlohmann::json{{"jsonrpc", "2.0"}, {"id", 5}, {"method", "tools/call"}, {"params", {{"name", "é"}}}});
  CHECK(lines[1] == nlohmann::json{{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}});
  CHECK(lines[2] == nlohmann::json{{"jsonrpc", "2.0"}, {"id", "a"}, {"result", {{"x", 1}}}});
  CHECK(lines[3] == nlohmann::json{{"jsonrpc", "2.0"},
                                   {"id", nullptr},
                                   {"error", {{"code", -32601}, {"message", "Method not found"}, {"data", "foo"}}}});
}

TEST_CASE("the elements of an array, each with its own text") {
  std::vector<std::string> raw;
  std::vector<machina::jsonrpc::Member::Type> types;
  std::string why;
  auto collect = [&](const machina::jsonrpc::Member& m) {
    raw.emplace_back(m.raw);
    types.push_back(m.type);
    return true;
  };
  REQUIRE(machina::jsonrpc::for_each_element(R"([ 1, "two" ,{"a":[3]}, [4, {"b":5}],null,true ])", collect, why));
  CHECK(raw == std::vector<std::string>{"1", "\"two\"", R"({"a":[3]})", R"([4, {"b":5}])", "null", "true"});
  CHECK(types[2] == machina::jsonrpc::Member::Type::object);
  CHECK(types[3] == machina::jsonrpc::Member::Type::array);
  raw.clear();
  CHECK(machina::jsonrpc::for_each_element("[]", collect, why));
  CHECK(raw.empty());
  CHECK_FALSE(machina::jsonrpc::for_each_element("{}", collect, why));
  CHECK_FALSE(machina::jsonrpc::for_each_element("[1,", collect, why));
  int seen = 0;
  CHECK_FALSE(
      machina::jsonrpc::for_each_element("[1,2,3]", [&](const machina::jsonrpc::Member&) { return ++seen < 2; }, why));
  CHECK(seen == 2);
}

namespace {
struct Seen {
  std::string key, raw, string;
  Member::Type type;
  bool operator==(const Seen&) const = default;
};
std::vector<Seen> members_of(const Message& m, bool from_parse) {
  std::vector<Seen> out;
  std::string why;
  auto each = [&](const Member& x) {
    out.push_back({std::string(x.key), std::string(x.raw), std::string(x.string), x.type});
    return true;
  };
  if (from_parse)
    CHECK(each_param(m, each, why));
  else
    CHECK(for_each_member(m.params, each, why));
  return out;
}
}  // namespace

TEST_CASE("params' members are found by the message's own parse, as a second pass would find them") {
  const Message m = read(R"({"jsonrpc":"2.0","id":1,"method":"tools/call","params": {"name" : "a\"b\u00e9",)"
                         R"( "arguments":{"x":[1,{"y":2}],"z":"w"}, "n":-1.5e3, "t":true, "f":false, "z0":null,)"
                         R"( "list":[ "p", {"q":[]} ], "_meta":{}}})");
  REQUIRE(m.params_members_found);
  CHECK(m.params_member_count == 8);
  const auto found = members_of(m, true);
  CHECK(found == members_of(m, false));
  REQUIRE(found.size() == 8);
  CHECK(found[0].key == "name");
  CHECK(found[0].string == "a\"b\xc3\xa9");
  CHECK(found[0].raw == R"("a\"b\u00e9")");
  CHECK(found[1].raw == R"({"x":[1,{"y":2}],"z":"w"})");
  CHECK(found[1].type == Member::Type::object);
  CHECK(found[2].type == Member::Type::number);
  CHECK(found[2].raw == "-1.5e3");
  CHECK(found[3].type == Member::Type::boolean);
  CHECK(found[5].type == Member::Type::null);
  CHECK(found[6].raw == R"([ "p", {"q":[]} ])");
  CHECK(found[6].type == Member::Type::array);
}

TEST_CASE("params the parse does not keep are read again: too many members, an array, given twice") {
  // Nine members: past what a message keeps, each_param reads the text itself.
  Message m =
      read(R"({"jsonrpc":"2.0","id":1,"method":"m","params":{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9}})");
  CHECK_FALSE(m.params_members_found);
  CHECK(members_of(m, true).size() == 9);
  // An array is no object: each_param says so, as for_each_member does.
  m = read(R"({"jsonrpc":"2.0","id":1,"method":"m","params":[1,2]})");
  CHECK_FALSE(m.params_members_found);
  std::string why;
  CHECK_FALSE(each_param(m, [](const Member&) { return true; }, why));
  // Given twice (which makes the message invalid: see below), the last params is what the
  // parse cut, its text and its members alike.
  m = read(R"({"jsonrpc":"2.0","id":1,"method":"m","params":{"a":1},"params":{"b":"two"}})");
  CHECK(m.params == R"({"b":"two"})");
  REQUIRE(m.params_members_found);
  CHECK(members_of(m, true) == std::vector<Seen>{{"b", R"("two")", "two", Member::Type::string}});
  m = read(R"({"jsonrpc":"2.0","id":1,"method":"m","params":{"a":1},"params":[3]})");
  CHECK_FALSE(m.params_members_found);
  // A message read into a Message that held another keeps nothing of the first.
  std::string ignored;
  REQUIRE(parse(R"({"jsonrpc":"2.0","id":2,"method":"n"})", m, ignored));
  CHECK(m.params.empty());
  CHECK_FALSE(m.params_members_found);
  CHECK(m.params_member_count == 0);
  REQUIRE(parse(R"({"jsonrpc":"2.0","id":3,"error":{"code":-1,"message":"no","data":[2]}})", m, ignored));
  REQUIRE(parse(R"({"jsonrpc":"2.0","id":4,"result":{}})", m, ignored));
  CHECK((m.kind == Message::Kind::result && m.method.empty() && m.error_code == 0 && m.error_message.empty() &&
         m.error_data.empty() && m.why.empty()));
  REQUIRE(parse(R"({"jsonrpc":"2.0"})", m, ignored));
  CHECK((m.kind == Message::Kind::invalid && m.id.empty() && m.result.empty() && !m.why.empty()));
}

TEST_CASE("a member of a message or of its error given twice makes it invalid, naming the member") {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"jsonrpc":"2.0","id":1,"id":2,"method":"ping"})", "id"},
      {R"({"jsonrpc":"2.0","jsonrpc":"2.0","id":1,"method":"ping"})", "jsonrpc"},
      {R"({"jsonrpc":"2.0","id":1,"method":"ping","method":"tools/list"})", "method"},
      {R"({"jsonrpc":"2.0","id":1,"method":"m","params":{},"params":{"a":1}})", "params"},
      {R"({"jsonrpc":"2.0","id":1,"result":1,"result":2})", "result"},
      {R"({"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"a"},"error":{"code":2,"message":"b"}})", "error"},
      {R"({"jsonrpc":"2.0","id":1,"error":{"code":1,"code":2,"message":"a"}})", "error.code"},
      {R"({"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"a","message":"b"}})", "error.message"},
      {R"({"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"a","data":1,"data":2}})", "error.data"},
  };
  for (const auto& [line_text, member] : cases) {
    const char* line = line_text;  // (CAPTURE takes it by reference: clang 14 refuses a structured binding there)
    CAPTURE(line);
    Message m;
    std::string why;
    REQUIRE(parse(line, m, why));
    CHECK(m.kind == Message::Kind::invalid);
    CHECK(m.why == "the member \"" + std::string(member) + "\" is given twice");
    if (std::string_view(member) == "id")
      CHECK(m.id.empty());  // (neither is the id)
    else
      CHECK(m.id == "1");
  }
  // Members a message does not have, and a member of params, may come twice: not the envelope's.
  Message m = read(R"({"jsonrpc":"2.0","id":1,"method":"m","x":1,"x":2,"params":{"a":1,"a":2}})");
  CHECK(m.kind == Message::Kind::request);
}

TEST_CASE("a parse inside another's callback reads its own text") {
  const Message m = read(R"({"jsonrpc":"2.0","id":1,"method":"m","params":{"outer":{"inner":[1,2,3]},"k":"v"}})");
  std::vector<std::string> seen;
  std::string why;
  CHECK(for_each_member(
      m.params,
      [&](const Member& outer) {
        seen.push_back(std::string(outer.key));
        if (outer.type == Member::Type::object) {
          std::string inner_why;
          CHECK(for_each_member(
              outer.raw,
              [&](const Member& inner) {
                seen.push_back(std::string(inner.key) + "=" + std::string(inner.raw));
                Message nested;
                CHECK(parse(R"({"jsonrpc":"2.0","method":"x","params":{"z":0}})", nested, inner_why));
                CHECK(nested.method == "x");
                return true;
              },
              inner_why));
        }
        return true;
      },
      why));
  CHECK(seen == std::vector<std::string>{"outer", "inner=[1,2,3]", "k"});
}

TEST_CASE("params the parse found plain are what validate_json takes, anything in doubt is left to it") {
  // (params_valid_json lets the --mcp and --skill fronts spare the host a second check of
  // a call's arguments: it must never be true for text validate_json would refuse.)
  const auto flag_of = [](const std::string& params) {
    Message m;
    std::string why;
    REQUIRE(parse(R"({"jsonrpc":"2.0","id":"\u0001","method":"tools/call","params":)" + params + "}", m, why));
    REQUIRE(m.params == params);
    return m.params_valid_json;
  };
  struct Case {
    std::string params;
    bool plain;
  };
  const std::vector<Case> cases = {
      {R"({"name":"a","arguments":{"x":[1,2.5,-3e2,{"y":"\u00e9 \"q\" \\"}],"t":true,"n":null}})", true},
      {R"({"arguments":{"n":1E5,"m":-0.5e-300}})", true},
      {R"({"arguments":{"s":"\u0001"}})", false},  // valid, but a control character
      // Past a double (the parse itself refuses exponents past 308, e.g. 1e400):
      {R"({"arguments":{"big":9.9e308}})", false},
      {R"({"arguments":{"big":-1.8E+308}})", false},
      {R"({"arguments":{"n":)" + std::string(300, '9') + "}}", true},
      {R"({"arguments":{"k":")" + std::string("\xff") + R"("}})", false},  // not UTF-8
      {R"({"arguments":{")" + std::string("\xc3\x28") + R"(":1}})", false},
      {R"({"arguments":{"lone":"\udc00"}})", false},  // decodes to ill-formed UTF-8
      {R"([1,"x",{"a":"\u0002"}])", false},
      {R"([1,"x",{"a":"b"}])", true},
      // params that are a scalar:
      {R"("\u0001")", false},
      {R"("plain")", true},
      {"1e308", true},
      {"9.9e308", false},
  };
  for (const auto& c : cases) {
    CAPTURE(c.params);
    const bool plain = flag_of(c.params);
    CHECK(plain == c.plain);
    if (plain) CHECK(machina::validate_json(c.params));
    if (!machina::validate_json(c.params)) CHECK_FALSE(plain);
  }
  // Given twice, the last params counts.
  Message m;
  std::string why;
  REQUIRE(parse(R"({"jsonrpc":"2.0","id":1,"method":"m","params":{"a":"\u0001"},"params":{"b":2}})", m, why));
  CHECK(m.params_valid_json);
  REQUIRE(parse(R"({"jsonrpc":"2.0","id":1,"method":"m","params":{"b":2},"params":{"a":"\u0001"}})", m, why));
  CHECK_FALSE(m.params_valid_json);
  // A message without params, or read after one with them, says nothing of params.
  REQUIRE(parse(R"({"jsonrpc":"2.0","id":1,"method":"m"})", m, why));
  CHECK_FALSE(m.params_valid_json);
}

TEST_CASE("strings read in place come out as nlohmann decodes them, whatever their length, content and place") {
  // Strings are scanned sixteen bytes at a time from wherever they start: every length
  // across two blocks, an escape or a multibyte character at every place, at several
  // alignments, with the raw parts around them still cut right.
  const auto values = machina::test::strings_with_inserts(
      {"", "\\\"", "\\\\", "\\n", "\\/", "\\u00e9", "\\ud83d\\ude00", "\xC3\xA9", "\xF0\x9F\x98\x80", "\\\"\\\\\\t"});
  int compared = 0;
  for (const std::string& value : values) {
    for (std::size_t indent = 0; indent < 16; indent += 5) {
      const std::string line = "{" + std::string(indent, ' ') + "\"jsonrpc\":\"2.0\",\"id\":\"" + value +
                               "\",\"method\":\"" + value + "\",\"params\":{\"k\":\"" + value + "\"}}";
      CAPTURE(line);
      const auto expected = nlohmann::json::parse(line);
      const Message m = read(line);
      CHECK(m.method == expected["method"].get<std::string>());
      CHECK(nlohmann::json::parse(m.id) == expected["id"]);
      CHECK(nlohmann::json::parse(m.params) == expected["params"]);
      ++compared;
    }
  }
  CHECK(compared > 3'000);
}
