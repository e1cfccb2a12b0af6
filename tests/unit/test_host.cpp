// Host::handle, the pipeline alone (no runner, no tool): the request's own rules hold for
// every front, including one that builds a Request itself (no decoder ran), and the
// response keeps the request's ds_state form. Calls that run tools: test_tool_host.cpp.
#include <machina/host.hpp>
#include <machina/json_text.hpp>

#include <doctest/doctest.h>

#include "host_call.hpp"

#include <string>

using namespace machina;

using machina::test::handle;
using machina::test::to;

TEST_CASE("request rules apply to a request no decoder has seen") {
  HostOptions options;
  options.max_request_bytes = 1000;
  Host host(options);
  Request big = to("AID.X");
  big.input_json = std::string(2000, ' ');
  CHECK(handle(host, big).kind == ErrorKind::request_too_large);
  CHECK(handle(host, to("")).error == "malformed request: field 'aid' must not be empty");
  Request late = to("AID.X");
  late.timeout_ms = 0;
  CHECK(handle(host, late).kind == ErrorKind::malformed_request);
  Host defaults;
  Request keyed = to("AID.X");
  keyed.idempotency_key = std::string(1025, 'k');
  CHECK(handle(defaults, keyed).error == "malformed request: idempotency_key is longer than 1024 bytes");
}

TEST_CASE("an unknown tool is named, at most 200 characters of it") {
  Host host;
  CHECK(handle(host, to("AID.NOPE.v1")).error == "tool not found: AID.NOPE.v1");
  const Response r = handle(host, to(std::string(1 << 20, 'a')));
  CHECK(r.kind == ErrorKind::tool_not_found);
  CHECK(r.error == "tool not found: " + std::string(kMaxEchoChars, 'a') + "\u2026 (1048576 bytes)");
  CHECK(r.status() == Status::INVALID_PICK);
}

TEST_CASE("a refusal's hint names the operator's commands the host is given, and none without them") {
  Host bare;
  CHECK(handle(bare, to("AID.NOPE.v1")).hint == "the tool list names every tool");
  HostOptions options;
  options.operator_commands.tool_list = "tools --all";
  Host named(options);
  CHECK(handle(named, to("AID.NOPE.v1")).hint == "the tool list (tools --all) names every tool");
}

TEST_CASE("the id is echoed and the ds_state form of the request is kept") {
  Host host;
  Request r = to("AID.NOPE.v1");
  r.id_json = "7";
  r.ds_state = DsUpdate{};
  r.ds_state->numbered = true;
  const Response out = handle(host, r);
  CHECK(out.id_json == "7");
  CHECK(out.ds_state.numbered);
}

TEST_CASE("a deferred schema that does not compile throws when its validator is first asked for") {
  Tool bad(CircuitBreaker::Options{});
  bad.info.aid = "AID.BAD.v1";
  bad.info.input_schema = R"({"type":"object","patternProperties":{}})";
  CHECK_NOTHROW(bad.compile_schema(/*defer=*/true));
  CHECK_THROWS_AS(bad.input_validator(), ConfigError);
  CHECK_THROWS_AS(bad.compile_schema(/*defer=*/false), ConfigError);
}
