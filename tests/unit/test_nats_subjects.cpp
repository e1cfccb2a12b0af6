// The NATS front's text rules: subject tokens, endpoint names, header values, error codes
// and typed errors of the micro-service API, URLs without credentials.
#include "../../toolhost/cli/nats_subjects.hpp"

#include <doctest/doctest.h>

#include <string>

using namespace machina::cli;

TEST_CASE("subject tokens: letters, digits, _ and -, joined by single dots") {
  CHECK(subject_safe("machina"));
  CHECK(subject_safe("a.b-c.d_e.9"));
  CHECK_FALSE(subject_safe(""));
  CHECK_FALSE(subject_safe(".a"));
  CHECK_FALSE(subject_safe("a."));
  CHECK_FALSE(subject_safe("a..b"));
  CHECK_FALSE(subject_safe("a b"));
  CHECK_FALSE(subject_safe("a.*"));
  CHECK_FALSE(subject_safe("a.>"));
}

TEST_CASE("an endpoint's name is its aid with other bytes as _, at most 200 bytes") {
  CHECK(endpoint_name("AID.ECHO.v1") == "AID_ECHO_v1");
  CHECK(endpoint_name("") == "tool");
  CHECK(endpoint_name(std::string(300, 'a')).size() == 200);
  CHECK(endpoint_name("é") == "__");
}

TEST_CASE("header text is cut at a character boundary, line breaks as spaces") {
  CHECK(header_text("a\r\nb", 100) == "a  b");
  CHECK(header_text("abcdef", 3) == "abc");
  CHECK(header_text("ab\xC3\xA9", 3) == "ab");  // not half of é
  CHECK(header_text("ab\xC3\xA9", 4) == "ab\xC3\xA9");
}

TEST_CASE("service error codes carry HTTP's meanings") {
  CHECK(std::string(service_error_code("INVALID_PICK", "tool_not_found")) == "404");
  CHECK(std::string(service_error_code("INVALID_PICK", "malformed_request")) == "400");
  CHECK(std::string(service_error_code("BREAKER_TRIP", "breaker_open")) == "503");
  CHECK(std::string(service_error_code("TOOL_ERROR", "timeout")) == "504");
  CHECK(std::string(service_error_code("TOOL_ERROR", "lease_required")) == "401");
  CHECK(std::string(service_error_code("TOOL_ERROR", "overloaded")) == "429");
  CHECK(std::string(service_error_code("TOOL_ERROR", "tool_error")) == "500");
}

TEST_CASE("typed errors are worded Type: message, once") {
  CHECK(typed_error("deadline passed", "timeout") == "Timeout: deadline passed");
  CHECK(typed_error("timeout: slow", "timeout") == "Timeout: slow");                       // the type's spelling, once
  CHECK(typed_error("NotFound: no such file", "tool_error") == "NotFound: no such file");  // typed by the tool
  CHECK(typed_error("ValueError: bad", "tool_error") == "SystemError: ValueError: bad");
  CHECK(typed_error("x", "no_such_code") == "SystemError: x");
}

TEST_CASE("server URLs are logged without credentials") {
  CHECK(without_credentials("nats://user:pw@host:4222") == "nats://***@host:4222");
  CHECK(without_credentials("nats://host:4222") == "nats://host:4222");
  CHECK(without_credentials("nats://a@h1,tls://h2") == "nats://***@h1,tls://h2");
  CHECK(without_credentials("token@host") == "***@host");
  CHECK(without_credentials("nats://host/path@x") == "nats://host/path@x");
}
