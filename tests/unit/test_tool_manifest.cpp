// Tool manifests: a good one loads with every field; a bad one is refused whole, the
// message naming file, line and field.
#include <machina/errors.hpp>
#include <machina/tool_manifest.hpp>

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

using namespace machina;

namespace {
std::string refusal(const std::string& text) {
  try {
    parse_tool_manifest(text, "/apps/demo/tools.toml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(loaded)";
}
}  // namespace

TEST_CASE("a manifest declares Python tools and services with their metadata") {
  const ToolManifest m = parse_tool_manifest(R"(
# two tools
[[tool]]
aid = "AID.PY.GREET.v1"
runner = "python"
entry = "tools.sample_tool:greet"
sandbox = true
guarantees = { no_network = true, no_subprocess = true }
description = "Greets"
tier = 1
deterministic = true
side_effects = ["none"]
timeout_seconds = 2.5
input_schema = { type = "object", required = ["name"], properties = { name = { type = "string" } } }

[[tool]]
aid = "AID.SVC.SUM.v1"
runner = "service"
url = "http://127.0.0.1:8080/run"
input_schema = '{"type": "object"}'
timeout_ms = 1500
)",
                                             "/apps/demo/tools.toml");
  REQUIRE(m.tools.size() == 2);
  const ManifestTool& py = m.tools[0];
  CHECK(py.info.aid == "AID.PY.GREET.v1");
  CHECK(py.info.name == "AID.PY.GREET.v1");  // no name: the aid
  CHECK(py.runner == "python");
  CHECK(py.entry == "tools.sample_tool:greet");
  CHECK(py.python == "python3");
  CHECK(py.root == "/apps/demo");  // modules resolve from the manifest's directory
  CHECK(py.sandbox);
  CHECK(py.guarantees == std::map<std::string, bool>{{"no_network", true}, {"no_subprocess", true}});
  CHECK(py.info.tier == 1);
  CHECK(py.info.deterministic);
  CHECK(py.info.side_effects == std::vector<std::string>{"none"});
  CHECK(py.info.default_timeout_ms == 2500);
  CHECK(py.info.plugin_path == "/apps/demo/tools.toml");
  CHECK(nlohmann::json::parse(py.info.input_schema)["required"] == nlohmann::json::array({"name"}));
  CHECK(py.line == 3);
  const ManifestTool& svc = m.tools[1];
  CHECK(svc.runner == "service");
  CHECK(svc.url == "http://127.0.0.1:8080/run");
  CHECK(svc.info.input_schema == R"({"type": "object"})");
  CHECK(svc.info.default_timeout_ms == 1500);
  CHECK(svc.line == 16);
}

TEST_CASE("a container tool: its image, command, runtime, variables and deadline") {
  const ToolManifest m = parse_tool_manifest(R"(
[[tool]]
aid = "AID.BOX.A.v1"
runner = "container"
entry = "tools.a:run"
image = "localhost/tools:1"
command = ["python3", "-m", "runner"]
container_runtime = "podman"
container_env = { GREETING = "hi" }
memory_mb = 64
guarantees = { no_network = true }

[[tool]]
aid = "AID.BOX.B.v1"
runner = "container"
entry = "tools.b:run"
image = "ghcr.io/team/tools:2"
)",
                                             "/apps/demo/tools.toml");
  REQUIRE(m.tools.size() == 2);
  const ManifestTool& a = m.tools[0];
  CHECK(a.runner == "container");
  CHECK(a.image == "localhost/tools:1");
  CHECK(a.command == std::vector<std::string>{"python3", "-m", "runner"});
  CHECK(a.container_runtime == "podman");
  REQUIRE(a.container_env.size() == 1);
  CHECK(a.container_env[0].first == "GREETING");
  CHECK(a.container_env[0].second == "hi");
  CHECK(a.memory_mb == 64);
  CHECK(a.guarantees.at("no_network"));
  CHECK(a.info.default_timeout_ms == 10'000);  // a Python tool's, as tool protocol v1 says
  CHECK(m.tools[1].command.empty());           // the protocol's runner module
  CHECK(m.tools[1].container_runtime.empty());
  CHECK(refusal("[[tool]]\naid = \"A\"\nrunner = \"container\"\nentry = \"m:f\"\n").find("field 'image'") !=
        std::string::npos);
  CHECK(refusal("[[tool]]\naid = \"A\"\nrunner = \"container\"\nentry = \"m:f\"\nimage = \"\"\n") ==
        "/apps/demo/tools.toml:5: tool 1 (A): field 'image': must not be empty");
}

TEST_CASE("a bad manifest is refused naming file, line and field") {
  CHECK(refusal("[[tool]]\naid = \"A\"\nrunner = \"python\"\n") ==
        "/apps/demo/tools.toml:1: tool 1 (A): field 'entry': is required");
  CHECK(refusal("[[tool]]\naid = \"A\"\nrunner = \"python\"\nentry = \"nocolon\"\n") ==
        "/apps/demo/tools.toml:4: tool 1 (A): field 'entry': must be 'module:function' (dotted names), not 'nocolon'");
  CHECK(refusal("[[tool]]\naid = 5\n") ==
        "/apps/demo/tools.toml:2: tool 1: field 'aid': must be a string, not an integer");
  CHECK(refusal("[[tool]]\naid = \"A\"\nrunner = \"python\"\nentry = \"m:f\"\nentyr = 1\n") ==
        "/apps/demo/tools.toml:5: tool 1 (A): unknown field 'entyr' (did you mean 'entry'?)");
  CHECK(refusal("[[tool]]\naid = \"A\"\nrunner = \"ruby\"\n") ==
        "/apps/demo/tools.toml:3: tool 1 (A): field 'runner': must be \"python\", \"service\" or \"container\", not "
        "'ruby'");
  CHECK(refusal("[[tool]]\naid = \"A\"\nrunner = \"service\"\nurl = \"ftp://x\"\n") ==
        "/apps/demo/tools.toml:4: tool 1 (A): field 'url': must start with http:// or https://");
  CHECK(refusal("[[tool]]\naid = \"A\"\nrunner = \"python\"\nentry = \"m:f\"\nguarantees = { no_teleport = true }\n") ==
        "/apps/demo/tools.toml:5: tool 1 (A): field 'guarantees': unknown guarantee 'no_teleport'");
  CHECK(refusal("[[tool]]\naid = \"A\"\nrunner = \"python\"\nentry = \"m:f\"\ntier = 7\n") ==
        "/apps/demo/tools.toml:5: tool 1 (A): field 'tier': must be 0..3");
  CHECK(refusal("[[tool]]\naid = \"A\"\nrunner = \"python\"\nentry = \"m:f\"\ntimeout_ms = 0\n") ==
        "/apps/demo/tools.toml:5: tool 1 (A): field 'timeout_ms': must be from 1 ms to 24 hours");
  CHECK(refusal("[[tool]]\naid = \"A\"\nrunner = \"python\"\nentry = \"m:f\"\n\n[[tool]]\naid = \"A\"\n"
                "runner = \"python\"\nentry = \"m:g\"\n") ==
        "/apps/demo/tools.toml:7: tool 2 (A): field 'aid': 'A' is declared twice in this file");
  CHECK(refusal("[[tool]]\naid = \"A\"\nrunner = \"mcp\"\n")
            .find("field 'runner': a skill or an MCP server is "
                  "declared with its own table") != std::string::npos);
  CHECK(refusal("title = \"x\"\n") ==
        "/apps/demo/tools.toml:1: unknown top-level key 'title' (tables are [defaults], [[tool]], [[skill]], "
        "[[mcp_server]])");
  CHECK(refusal("") == "/apps/demo/tools.toml:1: declares no tools (no [[tool]], [[skill]] or [[mcp_server]] table)");
  CHECK(refusal("[[skill]]\nname = \"s\"\n") ==
        "/apps/demo/tools.toml:1: skill 1 (s): field 'command': is required (the program and its arguments)");
  CHECK(refusal("[[mcp_server]]\ncommand = [\"x\"]\n") ==
        "/apps/demo/tools.toml:1: mcp_server 1: field 'name': is required");
  CHECK(refusal("[[skill]]\nname = \"s\"\ncommand = [\"x\"]\n\n[[mcp_server]]\nname = \"s\"\ncommand = [\"y\"]\n") ==
        "/apps/demo/tools.toml:6: mcp_server 1 (s): field 'name': 's' is declared twice in this file");
  CHECK(refusal("[[skill]]\nname = \"s\"\ncommand = [\"x\"]\ntick_interval_ms = -1\n") ==
        "/apps/demo/tools.toml:4: skill 1 (s): field 'tick_interval_ms': must be from 0 (no ticks) to 24 hours");
  CHECK(refusal("[[mcp_server]]\nname = \"m\"\ncommand = [\"x\"]\ntick_interval_ms = 5\n") ==
        "/apps/demo/tools.toml:4: mcp_server 1 (m): unknown field 'tick_interval_ms'");
  CHECK(refusal("[[tool]]\naid = \"A\"\nrunner = \"python\"\nentry = \"m:f\"\ninput_schema = { type = 5 }\n")
            .rfind("/apps/demo/tools.toml:5: tool 1 (A): field 'input_schema': ", 0) == 0);
  const std::string syntax = refusal("[[tool]]\naid = \"A\nrunner = 1\n");
  CHECK(syntax.rfind("/apps/demo/tools.toml:2: ", 0) == 0);
}

TEST_CASE("a skill's methods are lifecycle by default, skill on request, and no other") {
  const auto methods_of = [](const std::string& extra) {
    return parse_tool_manifest("[[skill]]\nname = \"s\"\ncommand = [\"x\"]\n" + extra, "/apps/demo/tools.toml")
        .children.at(0)
        .methods;
  };
  CHECK(methods_of("") == "lifecycle");
  CHECK(methods_of("methods = \"lifecycle\"\n") == "lifecycle");
  CHECK(methods_of("methods = \"skill\"\n") == "skill");
  CHECK(refusal("[[skill]]\nname = \"s\"\ncommand = [\"x\"]\nmethods = \"seed\"\n") ==
        "/apps/demo/tools.toml:4: skill 1 (s): field 'methods': must be \"lifecycle\" (lifecycle/*) or \"skill\" "
        "(skill/*), not 'seed'; \"seed\" is spelled \"lifecycle\"");
  CHECK(refusal("[[skill]]\nname = \"s\"\ncommand = [\"x\"]\nmethods = \"other\"\n") ==
        "/apps/demo/tools.toml:4: skill 1 (s): field 'methods': must be \"lifecycle\" (lifecycle/*) or \"skill\" "
        "(skill/*), not 'other'");
}
TEST_CASE("a manifest that cannot be read is refused naming the file") {
  CHECK_THROWS_WITH_AS(load_tool_manifest("/nonexistent/tools.toml"),
                       "/nonexistent/tools.toml: cannot open the tool manifest", ConfigError);
}
