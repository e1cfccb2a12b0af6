// SchemaValidator: the supported keywords, the first failing location in the message,
// and unsupported keywords refused when the tool registers.
#include <machina/errors.hpp>
#include <machina/schema_validator.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

using namespace machina;
using nlohmann::json;

TEST_CASE("instances are checked against type, required, ranges and additionalProperties") {
  SchemaValidator v(R"({"type":"object","properties":{"text":{"type":"string","minLength":1},
                       "top":{"type":"integer","minimum":0,"maximum":100}},
                       "required":["text"],"additionalProperties":false})");
  CHECK_FALSE(v.validate(json::parse(R"({"text":"a","top":3})")).has_value());
  CHECK(v.validate(json::parse(R"({"text":1})")) == "at /text: expected string, got number");
  CHECK(v.validate(json::parse(R"({})")).value().find("missing required property 'text'") != std::string::npos);
  CHECK(v.validate(json::parse(R"({"text":"a","top":101})")).value().find("/top") != std::string::npos);
  CHECK(v.validate(json::parse(R"({"text":"a","extra":1})")).has_value());
  CHECK(v.validate(json::parse(R"({"text":""})")).has_value());
}

TEST_CASE("a schema that is not JSON or uses an unsupported keyword is refused") {
  CHECK_THROWS_AS(SchemaValidator("{"), ConfigError);
  CHECK_THROWS_AS(SchemaValidator(R"({"type":"string","pattern":"^a"})").validate(json("a")), ConfigError);
}
