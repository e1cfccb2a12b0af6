// ServiceRunner against a real HTTP server on loopback: a call POSTs tool protocol v1's
// service request and its answer becomes the output or the tool's error; a tool whose
// guarantees the service does not enforce is refused coverage_missing before any call; a
// service that cannot be reached is service_unavailable.
#include <machina/call_context.hpp>
#include <machina/clock.hpp>
#include <machina/runners/service_runner.hpp>
#include <machina/tool.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "tiny_http_server.hpp"

#include <memory>
#include <string>

using namespace machina;
using machina::test::ok_reply;
using machina::test::TinyServer;

namespace {

struct NoOverrun final : Overrun {
  void overrun() noexcept override {}
};

struct Ran {
  RunOutcome outcome;
  std::string output, error, trace;
};

Ran run(ServiceRunner& runner, const std::string& input) {
  NoOverrun no_overrun;
  Tool tool{CircuitBreaker::Options{}};
  tool.info.aid = "AID.UNIT.SERVICE.v1";
  CallContext ctx(1 << 20, std::make_shared<const Slots>());
  const RunSpec spec{tool, input, steady_now_ms() + 10'000, 10'000, ctx, &no_overrun};
  Ran r;
  r.outcome = runner.run(spec);
  r.output = ctx.output;
  r.error = ctx.error;
  r.trace = ctx.trace_json;
  return r;
}

ServiceRunner runner_for(int port, std::map<std::string, bool> guarantees = {}) {
  ServiceToolFields f;
  f.url = "http://127.0.0.1:" + std::to_string(port) + "/run";
  f.name = "unit";
  f.entry = "tools:unit";
  f.guarantees = std::move(guarantees);
  f.max_answer_bytes = 1 << 20;
  return ServiceRunner(std::make_shared<http::Client>(http::Url{"127.0.0.1", std::to_string(port), "/"}), f);
}

}  // namespace

TEST_CASE("a service's answer becomes the output, its error the tool's error") {
  TinyServer good(ok_reply(R"({"ok":true,"result":{"x":1}})"));
  ServiceRunner ok = runner_for(good.port);
  const Ran r = run(ok, R"({"q":2})");
  CHECK(r.outcome.ending == RunOutcome::Ending::ran);
  CHECK(r.outcome.rc == MACHINA_TOOL_OK);
  CHECK(nlohmann::json::parse(r.output) == nlohmann::json{{"x", 1}});
  CHECK(nlohmann::json::parse(r.trace)["runner"].is_string());
  {
    std::lock_guard lock(good.mu);
    CHECK(good.last_request.rfind("POST /run HTTP/1.1\r\n", 0) == 0);
    const auto body = nlohmann::json::parse(good.last_request.substr(good.last_request.find("\r\n\r\n") + 4));
    CHECK(body["tool_name"] == "unit");
    CHECK(body["entry"] == "tools:unit");
    CHECK(body["payload"] == nlohmann::json{{"q", 2}});
  }

  TinyServer failing(ok_reply(R"({"ok":false,"error":{"type":"ValueError","message":"bad q"}})"));
  ServiceRunner err = runner_for(failing.port);
  const Ran e = run(err, "{}");
  CHECK(e.outcome.ending == RunOutcome::Ending::ran);
  CHECK(e.outcome.rc == MACHINA_TOOL_ERROR);
  CHECK(e.error == "ValueError: bad q");
}

TEST_CASE("guarantees the service does not enforce refuse the call, an unreachable service is unavailable") {
  TinyServer weak(ok_reply(R"({"ok":true,"enforcement":"none","supported_guarantees":{}})"));
  ServiceRunner guarded = runner_for(weak.port, {{"no_network", true}});
  const Ran refused = run(guarded, "{}");
  CHECK(refused.outcome.ending == RunOutcome::Ending::failed);
  CHECK(refused.outcome.failure == ErrorKind::coverage_missing);
  {
    std::lock_guard lock(weak.mu);
    CHECK(weak.last_request.rfind("POST /capabilities/handshake HTTP/1.1\r\n", 0) == 0);  // never /run
  }

  int free_port = 0;
  {
    TinyServer gone(ok_reply("{}"));
    free_port = gone.port;
  }
  ServiceRunner nowhere = runner_for(free_port);
  const Ran down = run(nowhere, "{}");
  CHECK(down.outcome.ending == RunOutcome::Ending::failed);
  CHECK(down.outcome.failure == ErrorKind::service_unavailable);
}
