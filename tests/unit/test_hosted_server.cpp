// A hosted server (runners/hosted_server.hpp): a skill run as a real child (python3 on
// PATH) is started, says what tools it has, runs calls through its runner, reads and writes
// the ds_state of the call in flight, is told of sessions, and leaves when closed.
#include <machina/call_context.hpp>
#include <machina/clock.hpp>
#include <machina/runners/hosted_server.hpp>
#include <machina/tool.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "temp_dir.hpp"

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

using namespace machina;

namespace {

// A lifecycle skill: `echo` answers its arguments as text; `remember` writes DS2 through
// state/set and reads it back with state/get; every lifecycle notice is logged to a file.
const char* kSkill = R"(
import json, sys
log = open(sys.argv[1], "a")
def send(m):
    print(json.dumps(m), flush=True)
pending = 0
for line in sys.stdin:
    m = json.loads(line)
    method, mid = m.get("method"), m.get("id")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": mid, "result": {"tools": [
            {"name": "echo", "description": "says it back", "parameters": {"type": "object"}},
            {"name": "remember"}]}})
    elif method and method.startswith("lifecycle/") or method == "shutdown":
        log.write(method + " " + json.dumps(m.get("params", {})) + "\n"); log.flush()
        if mid is not None:
            send({"jsonrpc": "2.0", "id": mid, "result": {}})
    elif method == "tools/call":
        p = m["params"]
        if p["name"] == "echo":
            send({"jsonrpc": "2.0", "id": mid, "result": {"content": json.dumps(p["arguments"])}})
        else:
            send({"jsonrpc": "2.0", "id": "set", "method": "state/set",
                  "params": {"slot": "DS2", "type": "note", "content": p["arguments"]}})
            json.loads(sys.stdin.readline())
            send({"jsonrpc": "2.0", "id": "get", "method": "state/get", "params": {"slot": 2}})
            got = json.loads(sys.stdin.readline())
            send({"jsonrpc": "2.0", "id": mid, "result": {"structuredContent": got["result"]}})
)";

struct NoOverrun final : Overrun {
  void overrun() noexcept override {}
};

struct Ran {
  RunOutcome outcome;
  std::string output;
  std::string error;
  std::unique_ptr<SlotChanges> writes;
};

Ran run(HostedServerToolRunner& runner, const std::string& input) {
  NoOverrun no_overrun;
  Tool tool{CircuitBreaker::Options{}};
  tool.info.aid = runner.tool();
  CallContext ctx(1 << 20, std::make_shared<const Slots>());
  const RunSpec spec{tool, input, steady_now_ms() + 10'000, 10'000, ctx, &no_overrun};
  Ran r;
  r.outcome = runner.run(spec);
  r.output = ctx.output;
  r.error = ctx.error;
  r.writes = std::move(ctx.changes);
  return r;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

HostedServerOptions skill_options(const TempDir& dir, const std::string& log) {
  HostedServerOptions o;
  o.dialect = HostedServerOptions::Dialect::lifecycle_skill;
  o.name = "probe";
  o.data_dir = (dir.path / "data").string();
  o.child.argv = {"/usr/bin/env", "python3", "-u", "-c", kSkill, log};
  const char* path = std::getenv("PATH");
  o.child.env = {std::string("PATH=") + (path != nullptr ? path : "/usr/bin:/bin")};
  o.child.name = "skill probe";
  return o;
}

}  // namespace

TEST_CASE("a lifecycle skill starts, lists its tools, runs calls and is told of its life") {
  TempDir dir;
  const std::string log = (dir.path / "lifecycle.log").string();
  auto server = std::make_shared<HostedServer>(skill_options(dir, log));
  const std::vector<RemoteTool> tools = server->start();
  REQUIRE(tools.size() == 2);
  CHECK(tools[0].name == "echo");
  CHECK(tools[0].description == "says it back");
  CHECK(tools[0].input_schema == R"({"type":"object"})");
  CHECK(tools[1].name == "remember");
  CHECK(server->kind() == "skill");
  CHECK(server->pid() > 0);

  HostedServerToolRunner echo(server, "echo");
  const Ran said = run(echo, R"({"word":"hi"})");
  CHECK(said.outcome.ending == RunOutcome::Ending::ran);
  CHECK(said.outcome.rc == MACHINA_TOOL_OK);
  CHECK(nlohmann::json::parse(said.output) == R"({"word": "hi"})");  // a string content: its text as a string

  const Ran refused = run(echo, "[1]");
  CHECK(refused.outcome.ending == RunOutcome::Ending::failed);
  CHECK(refused.outcome.failure == ErrorKind::invalid_input);

  HostedServerToolRunner remember(server, "remember");
  const Ran kept = run(remember, R"({"n":7})");
  REQUIRE(kept.outcome.ending == RunOutcome::Ending::ran);
  const auto got = nlohmann::json::parse(kept.output);
  CHECK(got["slot"] == "DS2");
  CHECK(got["artifact"]["type"] == "note");
  CHECK(got["artifact"]["content_json"] == R"({"n":7})");
  REQUIRE(kept.writes != nullptr);
  CHECK((kept.writes->set & (1u << 2)) != 0);

  server->session_started("s-1");
  server->session_ended("s-1");
  server->close();
  CHECK(server->pid() == 0);
  const std::string told = read_file(log);
  const auto load = told.find("lifecycle/onLoad");
  const auto start = told.find(R"(lifecycle/onSessionStart {"sessionId": "s-1"})");
  const auto end = told.find(R"(lifecycle/onSessionEnd {"sessionId": "s-1"})");
  const auto shutdown = told.find("shutdown {}");
  REQUIRE(load != std::string::npos);
  REQUIRE(start != std::string::npos);
  REQUIRE(end != std::string::npos);
  REQUIRE(shutdown != std::string::npos);
  CHECK(load < start);
  CHECK(start < end);
  CHECK(end < shutdown);

  const Ran closed = run(echo, "{}");
  CHECK(closed.outcome.ending == RunOutcome::Ending::crashed);
  CHECK(closed.outcome.detail.find("it was closed") != std::string::npos);
}

TEST_CASE("a skill that does not start says why, naming the step and its stderr") {
  TempDir dir;
  HostedServerOptions o = skill_options(dir, (dir.path / "log").string());
  o.child.argv = {"/usr/bin/env", "python3", "-c", "import sys; sys.stderr.write('no tools here\\n'); sys.exit(2)"};
  HostedServer server(std::move(o));
  try {
    server.start();
    FAIL("started");
  } catch (const ConfigError& e) {
    const std::string why = e.what();
    CHECK(why.find("initialize failed") != std::string::npos);
    CHECK(why.find("no tools here") != std::string::npos);
  }
}

TEST_CASE("remote tools are registered under aids made of their names") {
  CHECK(remote_aid("AID.MCP.FILES.", "read-file") == "AID.MCP.FILES.READ_FILE.v1");
  CHECK(default_aid_prefix("mcp_server", "files") == "AID.MCP.FILES.");
  CHECK(default_aid_prefix("skill", "my skill") == "AID.SKILL.MY_SKILL.");
}
