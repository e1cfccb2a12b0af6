// errors (the error kinds table): every kind once, codes unique and named like the
// enumerator, status and error type columns from their closed sets, the rows a call's
// response and the breaker depend on.
#include <machina/errors.hpp>

#include <doctest/doctest.h>

#include <set>
#include <string>
#include <string_view>

using namespace machina;

TEST_CASE("status names are the wire words") {
  CHECK(status_name(Status::OK) == "OK");
  CHECK(status_name(Status::INVALID_PICK) == "INVALID_PICK");
  CHECK(status_name(Status::TOOL_ERROR) == "TOOL_ERROR");
  CHECK(status_name(Status::BREAKER_TRIP) == "BREAKER_TRIP");
}

TEST_CASE("the table lists every kind but none, in declaration order, each code once") {
  const auto& kinds = all_error_kinds();
  REQUIRE(kinds.size() > 0);
  std::set<std::string_view> codes;
  std::size_t index = 1;
  for (const ErrorKindInfo& info : kinds) {
    CAPTURE(info.code);
    CHECK(static_cast<std::size_t>(info.kind) == index++);
    CHECK(&error_info(info.kind) == &info);
    CHECK_FALSE(info.code.empty());
    CHECK(codes.insert(info.code).second);
    // Wire codes are snake_case words.
    for (const char c : info.code) CHECK(((c >= 'a' && c <= 'z') || c == '_'));
    CHECK(info.status != Status::OK);
    const std::set<std::string_view> types{"AccessDenied", "NotFound", "InvalidInput", "Timeout", "SystemError"};
    CHECK(types.count(info.error_type) == 1);
    // Only a call that reached the tool counts against its breaker.
    if (info.counts_for_breaker) CHECK(info.call_response);
  }
}

TEST_CASE("none is success and no code") {
  const ErrorKindInfo& none = error_info(ErrorKind::none);
  CHECK(none.kind == ErrorKind::none);
  CHECK(none.code.empty());
  CHECK(none.status == Status::OK);
  CHECK_FALSE(none.counts_for_breaker);
  CHECK(none.error_type.empty());
}

TEST_CASE("rows the pipeline depends on") {
  CHECK(error_info(ErrorKind::tool_not_found).code == "tool_not_found");
  CHECK(error_info(ErrorKind::tool_not_found).status == Status::INVALID_PICK);
  CHECK(error_info(ErrorKind::tool_not_found).error_type == "NotFound");
  CHECK_FALSE(error_info(ErrorKind::malformed_request).call_response);
  CHECK(error_info(ErrorKind::breaker_open).status == Status::BREAKER_TRIP);
  CHECK_FALSE(error_info(ErrorKind::breaker_open).counts_for_breaker);
  CHECK(error_info(ErrorKind::timeout).error_type == "Timeout");
  CHECK(error_info(ErrorKind::timeout).counts_for_breaker);
  CHECK(error_info(ErrorKind::tool_crashed).counts_for_breaker);
  CHECK_FALSE(error_info(ErrorKind::tool_error).counts_for_breaker);
  CHECK(error_info(ErrorKind::access_denied).error_type == "AccessDenied");
}

TEST_CASE("ConfigError is a runtime_error carrying its message") {
  try {
    throw ConfigError("bad option");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "bad option");
  }
}
