// tool_names (the names a tool answers to and how it is advertised): LLM function names,
// plain and hashed, kept distinct across a registry; lookup by display name and LLM name;
// the advertised input and output schemas and MCP annotations.
#include <machina/aid_word.hpp>
#include <machina/tool.hpp>
#include <machina/tool_names.hpp>

#include <doctest/doctest.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

using namespace machina;
using json = nlohmann::ordered_json;

namespace {

bool allowed_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (const char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) {
      return false;
    }
  }
  return true;
}

std::unique_ptr<Tool> tool(const std::string& aid, const std::string& name) {
  auto t = std::make_unique<Tool>(CircuitBreaker::Options{});
  t->info.aid = aid;
  t->info.name = name;
  return t;
}

}  // namespace

TEST_CASE("a plain aid is its LLM name with each '.' as '-'") {
  CHECK(plain_llm_name("AID.ECHO.v1"));
  CHECK(plain_llm_name(std::string(64, 'a')));
  CHECK_FALSE(plain_llm_name(std::string(65, 'a')));
  CHECK_FALSE(plain_llm_name(""));
  CHECK_FALSE(plain_llm_name("a-b"));  // would collide with a.b
  CHECK_FALSE(plain_llm_name("a b"));
  CHECK(llm_function_name("AID.ECHO.v1") == "AID-ECHO-v1");
  CHECK(llm_function_name("AID.ECHO.v1", 3) == "AID-ECHO-v1");  // the salt is for hashed names only
}

TEST_CASE("another aid gets its nearest allowed form and a hash, within 64 bytes") {
  const std::string dashed = llm_function_name("a-b");
  CHECK(dashed.rfind("a-b-", 0) == 0);
  CHECK(dashed.size() == 3 + 1 + 12);
  CHECK(allowed_name(dashed));
  CHECK(dashed != llm_function_name("a-b", 1));
  CHECK(dashed == llm_function_name("a-b"));

  const std::string spaced = llm_function_name("fs/read file.v1");
  CHECK(spaced.rfind("fs_read_file-v1-", 0) == 0);
  const std::string utf8 = llm_function_name("caf\xc3\xa9");  // é is one character: one '_'
  CHECK(utf8.rfind("caf_-", 0) == 0);
  CHECK(utf8.size() == 4 + 1 + 12);
  const std::string broken = llm_function_name("a\xff\xfe");  // bytes that are no UTF-8: one each
  CHECK(broken.rfind("a__-", 0) == 0);

  const std::string empty = llm_function_name("");
  CHECK(empty.rfind("tool-", 0) == 0);
  CHECK(empty.size() == 5 + 12);

  const std::string long_name = llm_function_name(std::string(100, 'x') + "-");
  CHECK(long_name.size() == 64);
  CHECK(long_name.substr(0, 51) == std::string(51, 'x'));
  CHECK(long_name[51] == '-');
  CHECK(allowed_name(long_name));
}

TEST_CASE("the names of a list are distinct, a repeated aid keeps its name") {
  const std::vector<std::string_view> aids{"a-b", "a.b", "x y", "a-b", "AID.Z.v1"};
  const auto names = llm_function_names(aids);
  REQUIRE(names.size() == aids.size());
  CHECK(names[1] == "a-b");  // plain names keep theirs
  CHECK(names[4] == "AID-Z-v1");
  CHECK(names[0] == names[3]);
  CHECK(names[0] != names[1]);
  CHECK(names[0] == llm_function_name("a-b", 0));
  const std::set<std::string> distinct{names[0], names[1], names[2], names[4]};
  CHECK(distinct.size() == 4);
  for (const auto& n : names) CHECK(allowed_name(n));
}

TEST_CASE("a hashed name that a plain aid holds takes the next salt") {
  const std::string taken = llm_function_name("a b", 0);  // "a_b-<12 hex>"
  REQUIRE(plain_llm_name(taken) == false);                // holds '-': no aid's plain name
  // An aid whose plain name is the first salt's hashed name: "a_b.<hex>" → "a_b-<hex>".
  std::string plain_aid = taken;
  plain_aid[3] = '.';
  REQUIRE(plain_llm_name(plain_aid));
  const auto names = llm_function_names({"a b", plain_aid});
  CHECK(names[1] == taken);
  CHECK(names[0] == llm_function_name("a b", 1));
}

TEST_CASE("ToolNames finds a tool by its one display name, else by its LLM name") {
  auto echo = tool("AID.ECHO.v1", "echo");
  auto twin_a = tool("AID.A.v1", "twin");
  auto twin_b = tool("AID.B.v1", "twin");
  auto odd = tool("odd aid", "");
  ToolNames names;
  names.rebuild({echo.get(), twin_a.get(), twin_b.get(), odd.get()});
  CHECK(names.find("echo").tool == echo.get());
  CHECK(names.find("AID-ECHO-v1").tool == echo.get());
  const auto shared = names.find("twin");
  CHECK(shared.tool == nullptr);
  CHECK(shared.sharing == std::vector<const Tool*>{twin_a.get(), twin_b.get()});
  CHECK(names.find("").tool == nullptr);
  CHECK(names.find("").sharing.empty());
  CHECK(names.find("nothing").tool == nullptr);
  const std::string odd_name = names.llm_name(*odd);
  CHECK(odd_name.rfind("odd_aid-", 0) == 0);
  CHECK(names.find(odd_name).tool == odd.get());
  auto stranger = tool("AID.S.v1", "s");
  CHECK(names.llm_name(*stranger).empty());

  // An LLM name wins over a display name that is the same text.
  auto impostor = tool("AID.I.v1", "AID-ECHO-v1");
  names.rebuild({echo.get(), impostor.get()});
  CHECK(names.find("AID-ECHO-v1").tool == echo.get());
  // A rebuild forgets tools no longer listed.
  CHECK(names.find("twin").tool == nullptr);
  CHECK(names.find("twin").sharing.empty());
}

TEST_CASE("advertised schemas: an object schema as it is, anything else any object") {
  CHECK(advertised_input_schema(R"({"type":"object","required":["a"]})") ==
        json::parse(R"({"type":"object","required":["a"]})"));
  for (const char* other : {"", "{", R"({"type":"string"})", "[1]", R"({"properties":{}})"}) {
    CAPTURE(other);
    CHECK(advertised_input_schema(other) == json::parse(R"({"type":"object"})"));
  }
  ToolInfo info;
  info.listed_schema = R"({"type":"object","x-listed":true})";
  CHECK(&declared_input_schema(info) == &info.listed_schema);
  CHECK(advertised_input_schema(info)["x-listed"] == true);
  info.input_schema = R"({"type":"object"})";
  CHECK(&declared_input_schema(info) == &info.input_schema);
  CHECK(advertised_output_schema(info).is_null());
  info.output_schema = R"({"type":"object","properties":{"n":{"type":"integer"}}})";
  CHECK(advertised_output_schema(info)["properties"]["n"]["type"] == "integer");
  info.output_schema = R"({"type":"array"})";
  CHECK(advertised_output_schema(info).is_null());
}

TEST_CASE("annotations: the host's view from tier and side effects, a server's only where no weaker") {
  ToolInfo safe;
  safe.deterministic = false;
  CHECK(advertised_annotations(safe) ==
        json::parse(R"({"readOnlyHint":true,"destructiveHint":false,"idempotentHint":true})"));
  ToolInfo write;
  write.tier = 1;
  CHECK(advertised_annotations(write) ==
        json::parse(R"({"readOnlyHint":false,"destructiveHint":false,"idempotentHint":false})"));
  write.deterministic = true;
  CHECK(advertised_annotations(write)["idempotentHint"] == true);
  ToolInfo effects;
  effects.side_effects = {"network"};
  CHECK(advertised_annotations(effects)["readOnlyHint"] == false);
  ToolInfo system;
  system.tier = 2;
  CHECK(advertised_annotations(system)["destructiveHint"] == true);

  ToolInfo hosted;
  hosted.annotations = R"({"readOnlyHint":true,"destructiveHint":false,"title":"T"})";
  CHECK(advertised_annotations(hosted) == json::parse(hosted.annotations));
  hosted.tier = 3;
  CHECK(advertised_annotations(hosted) == json::parse(R"({"readOnlyHint":false,"destructiveHint":true,"title":"T"})"));
  hosted.annotations = "not json";
  CHECK(advertised_annotations(hosted)["destructiveHint"] == true);
  CHECK(advertised_annotations(hosted).contains("idempotentHint"));
}

TEST_CASE("aid_word writes a word of an aid in capitals, other characters as underscores") {
  CHECK(aid_word("readFile") == "READFILE");
  CHECK(aid_word("my-pack.v2") == "MY_PACK_V2");
  CHECK(aid_word("") == "");
}
