// ProcessRunner, assembled by a ToolHost with isolation = process and the machina-toolhost
// executable of this build as its worker: the built-in plugin's tools answer from worker
// processes (their output, and state changes that reach the caller's state), the plugin is
// described without being loaded here, an output over the cap fails its call only, and a
// closed host answers every later call.
#include <machina/tool_host.hpp>

#include <doctest/doctest.h>

#include <dlfcn.h>

#include "host_call.hpp"

#include <algorithm>
#include <string>
#include <vector>

using namespace machina;

using machina::test::to;

namespace {

HostOptions isolated() {
  HostOptions options;
  options.isolation = Isolation::process;
  options.workers.executable = MACHINA_TEST_TOOLHOST;
  options.workers.size = 1;
  return options;
}

Request call(const char* aid, std::string input_json) {
  Request r = to(aid);
  r.input_json = std::move(input_json);
  return r;
}

bool has(const std::vector<std::string>& aids, const std::string& aid) {
  return std::find(aids.begin(), aids.end(), aid) != aids.end();
}

}  // namespace

TEST_CASE("a plugin tool answers from a worker process, and its state change reaches the caller") {
  ToolHost tools(isolated());
  const auto aids = tools.load_plugin(MACHINA_TEST_PLUGIN);
  REQUIRE(has(aids, "AID.ECHO.v1"));
  CallerState caller(true);
  Request echo = call("AID.ECHO.v1", R"({"q":1})");
  const Response echoed = tools.host().handle(echo, caller);
  CHECK(echoed.ok());
  CHECK(echoed.output_json == R"({"q":1})");

  Request put = call("AID.STATE.PUT.v1", R"({"slot":2,"type":"note","content":"kept"})");
  CHECK(tools.host().handle(put, caller).ok());
  CHECK_FALSE(caller.empty());
  Request get = call("AID.STATE.GET.v1", R"({"slot":2})");
  const Response got = tools.host().handle(get, caller);  // the worker reads the state the host keeps
  REQUIRE(got.ok());
  CHECK(got.output_json.find("kept") != std::string::npos);

  const ToolHostStats stats = tools.stats();
  CHECK(stats.workers.started >= 1);
  CHECK(stats.workers.calls == 3);
  CHECK(stats.workers.crashed == 0);
}

TEST_CASE("the plugin is described by a worker: this process never loads it") {
  ProcessRunnerOptions options;
  options.executable = MACHINA_TEST_TOOLHOST;
  options.max_output_bytes = kMaxOutputBytes;  // (the caps a tool host hands its runner)
  options.max_request_bytes = kMaxRequestBytes;
  ProcessRunner runner(options);
  const std::vector<ToolInfo> infos = runner.describe(MACHINA_TEST_PLUGIN);
  CHECK(std::any_of(infos.begin(), infos.end(), [](const ToolInfo& t) { return t.aid == "AID.ECHO.v1"; }));
  CHECK(::dlopen(MACHINA_TEST_PLUGIN, RTLD_NOW | RTLD_NOLOAD) == nullptr);  // not loaded in this process
  CHECK_THROWS_AS(runner.describe("/nonexistent/plugin.so"), ConfigError);
}

TEST_CASE("an output over the cap fails its call only, and the worker serves the next") {
  HostOptions options = isolated();
  options.max_output_bytes = 64;
  ToolHost tools(options);
  tools.load_plugin(MACHINA_TEST_PLUGIN);
  CallerState caller(true);
  Request big = call("AID.ECHO.v1", R"({"text":")" + std::string(200, 'x') + R"("})");
  CHECK(tools.host().handle(big, caller).kind == ErrorKind::output_too_large);
  Request small = call("AID.ECHO.v1", R"({"q":2})");
  CHECK(tools.host().handle(small, caller).ok());
}

TEST_CASE("a closed tool host answers later calls with a failure, not a hang") {
  ToolHost tools(isolated());
  tools.load_plugin(MACHINA_TEST_PLUGIN);
  CallerState caller(true);
  Request echo = call("AID.ECHO.v1", R"({"q":3})");
  REQUIRE(tools.host().handle(echo, caller).ok());
  tools.close();
  CHECK(tools.stats().workers.live == 0);
  Request again = call("AID.ECHO.v1", R"({"q":4})");
  const Response r = tools.host().handle(again, caller);
  CHECK_FALSE(r.ok());
  CHECK(r.kind == ErrorKind::internal_error);
}
