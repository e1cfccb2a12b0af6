// code_pack (code.grep, and code.search beside it, through PackRunner): matches with path,
// line and content in both shapes, case folding, a file or folder beneath the root, denied
// names and hidden files left out, the results cap, a pattern that is no regular
// expression, and refusals of bad inputs; code.search finds an identifier by its parts.

#include <doctest/doctest.h>

#include "pack_call.hpp"

#include <filesystem>
#include <string>

using namespace machina;
using machina::test::call_pack;
using machina::test::check_refused;
using machina::test::PackAnswer;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

/// ripgrep beside the test's interpreter (the venv), else on the usual paths; "" if none.
std::string ripgrep() {
  const fs::path venv = fs::path(__FILE__).parent_path().parent_path().parent_path() / ".venv" / "bin" / "rg";
  for (const fs::path& p : {venv, fs::path("/usr/bin/rg"), fs::path("/usr/local/bin/rg")}) {
    if (fs::exists(p)) return fs::absolute(p).string();
  }
  return "";
}

struct Code : machina::test::PackWorkspace {
  Code() {
    policy.code.rg = ripgrep();
    policy.code.index_dir = (tmp.path / "index").string();
    policy.code.index_dir_conflict.clear();
    put("src/main.cpp", "int main() {\n  return parseHttpRequest();\n}\n");
    put("src/util.py", "def Helper():\n    return 'MAIN'\n");
    put(".env", "main=secret\n");
    put("src/.hidden.txt", "main\n");
  }
};

}  // namespace

TEST_CASE("code.grep: matches beneath the root, denied and hidden files left out") {
  Code c;
  if (c.policy.code.rg.empty()) {
    MESSAGE("no ripgrep here: skipped");
    return;
  }
  PackRunner runner(c.policy, "");
  auto a = call_pack(runner, "AID.CODE.GREP.v1", {{"pattern", "main"}});
  REQUIRE_MESSAGE(a.ok(), a.outcome.detail);
  CHECK(a.output == json{{"matches", {{{"path", "src/main.cpp"}, {"line", 1}, {"content", "int main() {"}}}},
                         {"truncated", false}});

  a = call_pack(runner, "AID.CODE.GREP.v1", {{"pattern", "main"}, {"ignore_case", true}, {"path", "src"}});
  REQUIRE(a.ok());
  CHECK(a.output["matches"].size() == 2);
  const std::string paths = a.output["matches"].dump();
  CHECK(paths.find("src/util.py") != std::string::npos);
  CHECK(paths.find(".hidden") == std::string::npos);

  a = call_pack(runner, "AID.CODE.GREP.v1", {{"pattern", "return"}, {"path", "src/util.py"}});
  REQUIRE(a.ok());
  CHECK(a.output["matches"] == json{{{"path", "src/util.py"}, {"line", 2}, {"content", "    return 'MAIN'"}}});

  a = call_pack(runner, "tools.code.grep", {{"pattern", "parse[A-Z]"}});
  REQUIRE(a.ok());
  CHECK(a.output.is_array());
  CHECK(a.output == json{{{"path", "src/main.cpp"}, {"line", 2}, {"content", "  return parseHttpRequest();"}}});

  a = call_pack(runner, "AID.CODE.GREP.v1", {{"pattern", "nothing-like-this"}});
  REQUIRE(a.ok());
  CHECK(a.output["matches"].empty());
}

TEST_CASE("code.grep: the results cap and refusals") {
  Code c;
  if (c.policy.code.rg.empty()) {
    MESSAGE("no ripgrep here: skipped");
    return;
  }
  c.policy.code.max_results = 2;
  for (int i = 0; i < 3; ++i) c.put("src/hit" + std::to_string(i) + ".txt", "hit\n");
  PackRunner runner(c.policy, "");
  auto a = call_pack(runner, "AID.CODE.GREP.v1", {{"pattern", "hit"}});
  REQUIRE(a.ok());
  CHECK(a.output["matches"].size() == 2);
  CHECK(a.output["truncated"] == true);
  a = call_pack(runner, "AID.CODE.GREP.v1", {{"pattern", "hit"}, {"max_results", 1}});
  REQUIRE(a.ok());
  CHECK(a.output["matches"].size() == 1);
  check_refused(call_pack(runner, "AID.CODE.GREP.v1", {{"pattern", "hit"}, {"max_results", 3}}),
                ErrorKind::invalid_input, "max_results must be from 1 to 2");
  check_refused(call_pack(runner, "AID.CODE.GREP.v1", {{"pattern", "hit"}, {"max_results", 0}}),
                ErrorKind::invalid_input, "max_results must be from 1 to 2");
  check_refused(call_pack(runner, "AID.CODE.GREP.v1", {{"pattern", ""}}), ErrorKind::invalid_input,
                "pattern must not be empty");
  check_refused(call_pack(runner, "AID.CODE.GREP.v1", {{"pattern", std::string("a\0b", 3)}}), ErrorKind::invalid_input,
                "pattern must not contain a NUL character");
  check_refused(call_pack(runner, "AID.CODE.GREP.v1", {{"pattern", "(unclosed"}}), ErrorKind::invalid_input,
                "pattern is not a regular expression");
  check_refused(call_pack(runner, "AID.CODE.GREP.v1", {{"pattern", "x"}, {"path", "/etc"}}), ErrorKind::access_denied,
                "is outside the allowed directories");
  check_refused(call_pack(runner, "AID.CODE.GREP.v1", {{"pattern", "x"}, {"path", ".env"}}), ErrorKind::access_denied,
                "matches the deny pattern");
  check_refused(call_pack(runner, "AID.CODE.GREP.v1", {{"pattern", "x"}, {"path", "gone"}}),
                ErrorKind::target_not_found, "NotFound: gone");
}

TEST_CASE("code.search finds an identifier by its parts, and refuses bad queries") {
  Code c;
  if (c.policy.code.rg.empty()) {
    MESSAGE("no ripgrep here: skipped");
    return;
  }
  PackRunner runner(c.policy, "");
  auto a = call_pack(runner, "AID.CODE.SEARCH.v1", {{"query", "http request"}});
  REQUIRE_MESSAGE(a.ok(), a.outcome.detail);
  REQUIRE_FALSE(a.output["results"].empty());
  CHECK(a.output["results"][0]["path"] == "src/main.cpp");
  CHECK(a.output["results"][0]["line"] == 2);
  CHECK(a.output["results"][0]["similarity"].get<double>() > 0);
  CHECK(a.output["results"][0]["similarity"].get<double>() <= 1);
  CHECK(a.output["codebase_id"].is_null());
  CHECK(a.output["results"].dump().find(".env") == std::string::npos);
  check_refused(call_pack(runner, "AID.CODE.SEARCH.v1", {{"query", "   "}}), ErrorKind::invalid_input,
                "query must hold at least one word");
  check_refused(call_pack(runner, "AID.CODE.SEARCH.v1", {{"query", "x"}, {"limit", 101}}), ErrorKind::invalid_input,
                "limit must be a whole number from 1 to 100");
  check_refused(call_pack(runner, "AID.CODE.SEARCH.v1", {{"query", std::string(1001, 'q')}}), ErrorKind::invalid_input,
                "query is 1001 bytes, over the limit of 1000");
  check_refused(call_pack(runner, "AID.CODE.SEARCH.v1", {{"query", "x"}, {"codebase_id", "web"}}),
                ErrorKind::access_denied, "codebase 'web' is not available to this caller");
}

TEST_CASE("code.grep: more matches in one file than max_results say truncated") {
  // (rg stops each file one match past max_results, so the extra match in this file shows.)
  Code c;
  if (c.policy.code.rg.empty()) {
    MESSAGE("no ripgrep here: skipped");
    return;
  }
  c.put("src/many.txt", "hit\nhit\nhit\n");
  PackRunner runner(c.policy, "");
  const auto a = call_pack(runner, "AID.CODE.GREP.v1", {{"pattern", "hit"}, {"max_results", 2}});
  REQUIRE(a.ok());
  CHECK(a.output["matches"].size() == 2);
  CHECK(a.output["truncated"] == true);
}
