// json_text: JSON validation, UTF-8 repair, string encoding and excerpts of client text.
#include <machina/json_text.hpp>

#include <doctest/doctest.h>

#include <string>

using namespace machina;

TEST_CASE("validate_json accepts JSON texts and explains the rest") {
  CHECK(validate_json(std::string_view("{\"a\":[1,2.5,null,true]}")));
  CHECK(validate_json(std::string_view("  7 ")));
  std::string why;
  CHECK_FALSE(validate_json(std::string_view("{\"a\":}"), &why));
  CHECK(why.find("at byte") != std::string::npos);
  CHECK_FALSE(validate_json(std::string_view("")));
  CHECK_FALSE(validate_json(std::string_view("[1] [2]")));
}

TEST_CASE("to_valid_utf8 replaces ill-formed sequences") {
  CHECK(to_valid_utf8("ok é") == "ok é");
  CHECK(to_valid_utf8(std::string("a\xff") + "b") ==
        "a\xEF\xBF\xBD"
        "b");
  CHECK(is_valid_utf8("é"));
  CHECK_FALSE(is_valid_utf8("\xC3"));
}

TEST_CASE("append_json_string escapes quotes, backslashes and controls") {
  std::string out;
  append_json_string(out, "a\"b\\c\n\x01");
  CHECK(out == "\"a\\\"b\\\\c\\n\\u0001\"");
}

TEST_CASE("excerpt keeps short text whole and cuts long text between characters") {
  CHECK(excerpt("AID.ECHO.v1") == "AID.ECHO.v1");
  const std::string exact(kMaxEchoChars, 'x');
  CHECK(excerpt(exact) == exact);
  CHECK(excerpt(exact + "y") == exact + "\u2026 (201 bytes)");
  std::string accents;
  for (int i = 0; i < 300; ++i) accents += "é";  // 2 bytes each
  const std::string cut = excerpt(accents);
  CHECK(cut == accents.substr(0, 400) + "\u2026 (600 bytes)");
  CHECK(is_valid_utf8(cut));
}

TEST_CASE("starts_json_object looks past white space for an opening brace") {
  CHECK(starts_json_object("{}"));
  CHECK(starts_json_object(" \t\r\n{\"a\":1}"));
  CHECK_FALSE(starts_json_object("[{}]"));
  CHECK_FALSE(starts_json_object("\"{\""));
  CHECK_FALSE(starts_json_object("   "));
  CHECK_FALSE(starts_json_object(""));
}
