// pack_manifest (namel3ss pack folders): the example pack loads into Python tools named
// AID.PACK.<ID>.<TOOL>.v1 with capabilities.yaml's guarantees; every refusal names its
// file, line and field; the size cap of a pack file.
#include <machina/errors.hpp>
#include <machina/pack_manifest.hpp>

#include <doctest/doctest.h>

#include "temp_dir.hpp"

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

using namespace machina;
namespace fs = std::filesystem;

namespace {

const fs::path kExample = fs::path(__FILE__).parent_path().parent_path() / "packs" / "example.greeting";

void write(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

const std::string kPack =
    "id: \"my.pack\"\nname: \"Mine\"\nversion: \"1\"\ndescription: \"d\"\nauthor: \"a\"\n"
    "license: \"MIT\"\ntools:\n  - \"do it\"\n";
const std::string kTools = "tools:\n  \"do it\":\n    kind: \"python\"\n    entry: \"tools.x:run\"\n";

/// A pack made of these files ("" leaves a file out); the error of loading it, "" if none.
std::string error_of(const TempDir& tmp, const std::string& pack, const std::string& tools,
                     const std::string& caps = "") {
  if (!pack.empty()) write(tmp.path / "pack.yaml", pack);
  if (!tools.empty()) write(tmp.path / "tools.yaml", tools);
  if (!caps.empty()) write(tmp.path / "capabilities.yaml", caps);
  try {
    load_pack_dir(tmp.path.string());
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the example pack: one Python tool with the capabilities' guarantees") {
  REQUIRE(is_pack_dir(kExample.string()));
  const ToolManifest m = load_pack_dir(kExample.string());
  REQUIRE(m.tools.size() == 1);
  const ManifestTool& t = m.tools[0];
  CHECK(t.info.aid == "AID.PACK.EXAMPLE_GREETING.COMPOSE_GREETING.v1");
  CHECK(t.info.name == "compose greeting");
  CHECK(t.info.description == "Local greeting tools.");
  CHECK(t.runner == "python");
  CHECK(t.entry == "tools.greet:run");
  CHECK(t.python == "python3");
  CHECK(t.root == fs::absolute(kExample).lexically_normal().string());
  CHECK(t.info.default_timeout_ms == 10'000);
  CHECK_FALSE(t.info.deterministic);
  CHECK(t.pack.source == "installed_pack");
  CHECK(t.pack.id == "example.greeting");
  CHECK(t.pack.bindings_path == (fs::absolute(kExample).lexically_normal() / "tools.yaml").string());
  CHECK(t.line == 3);
  for (const char* g : {"no_filesystem_read", "no_filesystem_write", "no_network", "no_subprocess", "no_env_read"}) {
    CAPTURE(g);
    CHECK(t.guarantees.at(g));
  }
}

TEST_CASE("a folder without pack files is no pack") {
  TempDir tmp;
  CHECK_FALSE(is_pack_dir(tmp.path.string()));
  CHECK(error_of(tmp, "", "").find("no pack.yaml in the pack") != std::string::npos);
  write(tmp.path / "pack.yaml", kPack);
  CHECK(is_pack_dir(tmp.path.string()));
  CHECK(error_of(tmp, "", "").find("no tools.yaml in the pack") != std::string::npos);
}

TEST_CASE("a minimal pack, its optional bindings and capability levels") {
  TempDir tmp;
  const std::string tools =
      "tools:\n  \"do it\":\n    kind: python\n    entry: \"tools.x:run\"\n    purity: pure\n"
      "    timeout_ms: 250\n    sandbox: true\n    runner: local\n";
  const std::string caps =
      "capabilities:\n  \"do it\":\n    filesystem: read\n    network: outbound\n    env: none\n"
      "    subprocess: allow\n    secrets: [API_TOKEN]\n";
  write(tmp.path / "requirements.txt", "");
  REQUIRE(error_of(tmp, kPack, tools, caps) == "");
  const ToolManifest m = load_pack_dir(tmp.path.string());
  REQUIRE(m.tools.size() == 1);
  const ManifestTool& t = m.tools[0];
  CHECK(t.info.aid == "AID.PACK.MY_PACK.DO_IT.v1");
  CHECK(t.info.deterministic);
  CHECK(t.info.default_timeout_ms == 250);
  CHECK(t.sandbox);
  CHECK(t.deps_source == "requirements");
  CHECK(t.env == std::vector<std::string>{"API_TOKEN"});
  CHECK(t.guarantees.count("no_filesystem_write") == 1);
  CHECK(t.guarantees.count("no_filesystem_read") == 0);
  CHECK(t.guarantees.count("no_network") == 0);
  CHECK(t.guarantees.count("no_subprocess") == 0);
  CHECK(t.guarantees.count("no_env_read") == 0);  // it reads its secrets
}

TEST_CASE("refusals name the file, the line and the field") {
  struct Case {
    std::string pack, tools, caps, expected;
  };
  const std::string pack_head =
      "id: \"p\"\nname: \"n\"\nversion: \"1\"\ndescription: \"d\"\nauthor: \"a\"\nlicense: \"l\"\n";
  const Case cases[] = {
      {kPack + "colour: red\n", kTools, "", "pack.yaml:9: unknown key 'colour'"},
      {"id: \"\"\nname: n\nversion: v\ndescription: d\nauthor: a\nlicense: l\ntools: [\"do it\"]\n", kTools, "",
       "pack.yaml:1: field 'id': must not be empty"},
      {"id: p\nname: [1]\n", kTools, "", "pack.yaml:2: field 'name': must be text, not a list"},
      {"id: p\n", kTools, "", "pack.yaml: field 'name': is required"},
      {pack_head, kTools, "", "pack.yaml: field 'tools': is required"},
      {pack_head + "tools: []\n", kTools, "", "field 'tools': must be a list of tool names"},
      {pack_head + "tools: [\"do it\", \"do it\"]\n", kTools, "", "'do it' is listed twice"},
      {pack_head + "tools: [\"other\"]\n", kTools, "", "the tool 'other' has no binding in tools.yaml"},
      {pack_head + "runners: {default: docker}\ntools: [\"do it\"]\n", kTools, "",
       "pack.yaml:7: runners: field 'default': must be one of local, service, container, not 'docker'"},
      {pack_head + "service_url: ftp://h\ntools: [\"do it\"]\n", kTools, "",
       "pack.yaml:7: field 'service_url': must start with http:// or https://"},
      {pack_head + "container: [1]\ntools: [\"do it\"]\n", kTools, "",
       "pack.yaml:7: field 'container': must be a mapping (image: ...)"},
      {pack_head + "container: {image: i, tag: t}\ntools: [\"do it\"]\n", kTools, "",
       "pack.yaml:7: field 'container': unknown key 'tag' (image: is the only one)"},
      {pack_head + "runners: {default: local, other: x}\ntools: [\"do it\"]\n", kTools, "",
       "pack.yaml:7: field 'runners': unknown key 'other' (default: is the only one)"},
      {kPack, "tools:\n  \"do it\":\n    kind: python\n    entry: \"x:run\"\n  \"extra\":\n    kind: python\n", "",
       "tools.yaml:5: tool 'extra': is not one of the tools pack.yaml lists"},
      {kPack, "tools:\n  \"do it\":\n    kind: shell\n    entry: \"x:run\"\n", "",
       "tools.yaml:3: tool 'do it': field 'kind': must be \"python\", not 'shell'"},
      {kPack, "tools:\n  \"do it\":\n    kind: python\n    entry: \"x.run\"\n", "",
       "tools.yaml:4: tool 'do it': field 'entry': must be 'module:function'"},
      {kPack, "tools:\n  \"do it\":\n    kind: python\n    entry: \"a:b:c\"\n", "", "must be 'module:function'"},
      {kPack, "tools:\n  \"do it\":\n    kind: python\n    entry: \"x:run\"\n    url: http://h\n", "",
       "tools.yaml:5: tool 'do it': field 'url': is for the service runner; this tool's runner is local"},
      {kPack, "tools:\n  \"do it\":\n    kind: python\n    entry: \"x:run\"\n    runner: service\n    image: i\n", "",
       "tools.yaml:6: tool 'do it': field 'image': is for the container runner; this tool's runner is service"},
      {kPack, "tools:\n  \"do it\":\n    entry: \"x:run\"\n    runner: container\n    image: i\n    sandbox: true\n",
       "", "tools.yaml:6: tool 'do it': field 'sandbox': is for the local runner; this tool's runner is container"},
      {kPack, "tools:\n  \"do it\":\n    entry: \"x:run\"\n    runner: container\n    image: i\n    command: []\n", "",
       "tools.yaml:6: tool 'do it': field 'command': must be a list of words"},
      {kPack, "tools:\n  \"do it\":\n    entry: \"x:run\"\n    runner: container\n    image: i\n    env: [A]\n", "",
       "tools.yaml:6: tool 'do it': field 'env': must be a mapping of names to values"},
      {kPack + "entrypoints: [1]\n", "", "", "pack.yaml:9: field 'entrypoints': must be a mapping of tool names"},
      {kPack, "", "", "no tools.yaml in the pack and no entrypoints in its pack.yaml"},
      {kPack, "tools:\n  \"do it\":\n    kind: python\n    entry: \"x:run\"\n    colour: red\n", "",
       "tools.yaml:5: tool 'do it': unknown field 'colour'"},
      {kPack, "tools:\n  \"do it\":\n    kind: python\n    entry: \"x:run\"\n    purity: maybe\n", "",
       "field 'purity': must be pure or impure, not 'maybe'"},
      {kPack, "tools:\n  \"do it\":\n    kind: python\n    entry: \"x:run\"\n    timeout_ms: 0\n", "",
       "field 'timeout_ms': must be an integer from 1 ms to 24 hours"},
      {kPack, "tools:\n  \"do it\":\n    kind: python\n    entry: \"x:run\"\n    timeout_ms: 86400001\n", "",
       "field 'timeout_ms': must be an integer from 1 ms to 24 hours"},
      {kPack, "tools:\n  \"do it\":\n    kind: python\n    entry: \"x:run\"\n    sandbox: perhaps\n", "",
       "field 'sandbox': must be true or false"},
      {kPack, "tools:\n  \"do it\":\n    kind: python\n    entry: \"x:run\"\n    runner: container\n", "",
       "tools.yaml:3: tool 'do it': the container runner needs an image"},
      {kPack, "tools:\n  \"do it\":\n    kind: python\n    entry: \"x:run\"\n    runner: service\n", "",
       "tools.yaml:3: tool 'do it': the service runner needs a URL"},
      {kPack, "bindings: {}\n", "", "tools.yaml:1: unknown key 'bindings' (tools: is the only one)"},
      {kPack, "tools: [1]\n", "", "'tools' must be a mapping of tool names to bindings"},
      {kPack, kTools, "capabilities:\n  \"nope\": {}\n",
       "capabilities.yaml:2: tool 'nope': is not one of the tools pack.yaml lists"},
      {kPack, kTools, "capabilities:\n  \"do it\":\n    filesystem: all\n    network: none\n",
       "capabilities.yaml:3: tool 'do it': field 'filesystem': must be one of none, read, write, not 'all'"},
      {kPack, kTools,
       "capabilities:\n  \"do it\":\n    filesystem: none\n    network: none\n    env: none\n    subprocess: none\n"
       "    secrets: [\"A=B\"]\n",
       "field 'secrets': each must be a variable name"},
      {kPack, kTools, "caps: {}\n", "capabilities.yaml:1: unknown key 'caps'"},
      {kPack, "tools: {\"do it\": {kind: python, entry: \"x:run\"\n", "", "tools.yaml:"},
      {kPack, "tools: {\"do it\": [\n", "", ": not valid YAML"},
      {"- a\n- b\n", kTools, "", "pack.yaml: must be a mapping of keys to values"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.pack);
    CAPTURE(c.tools);
    CAPTURE(c.caps);
    TempDir tmp;
    const std::string error = error_of(tmp, c.pack, c.tools, c.caps);
    CHECK_MESSAGE(error.find(c.expected) != std::string::npos, error);
    CHECK(error.rfind(tmp.path.string(), 0) == 0);  // it starts with the file's path
  }
}

TEST_CASE("service and container bindings, with pack.yaml's defaults, and entrypoints in pack.yaml") {
  const std::string head = "id: p\nname: n\nversion: v\ndescription: d\nauthor: a\nlicense: l\n";
  {
    TempDir tmp;
    write(tmp.path / "pack.yaml", head +
                                      "tools: [\"a\", \"b\", \"c\"]\nrunners: {default: service}\n"
                                      "service_url: \"https://svc.example/run\"\ncontainer: {image: \"img:1\"}\n");
    write(tmp.path / "tools.yaml",
          "tools:\n  \"a\": {kind: python, entry: \"m:a\"}\n"
          "  \"b\": {kind: python, entry: \"m:b\", runner: container, command: [\"run\", \"it\"], env: {K: v}, "
          "enforcement: declared}\n"
          "  \"c\": {kind: python, entry: \"m:c\", runner: local}\n");
    const ToolManifest m = load_pack_dir(tmp.path.string());
    REQUIRE(m.tools.size() == 3);
    CHECK(m.tools[0].runner == "service");
    CHECK(m.tools[0].url == "https://svc.example/run");
    CHECK(m.tools[1].runner == "container");
    CHECK(m.tools[1].image == "img:1");
    CHECK(m.tools[1].command == std::vector<std::string>{"run", "it"});
    REQUIRE(m.tools[1].container_env.size() == 1);
    CHECK(m.tools[1].container_env[0] == std::pair<std::string, std::string>{"K", "v"});
    CHECK(m.tools[1].info.default_timeout_ms == 10'000);
    CHECK(m.tools[2].runner == "python");
  }
  {
    TempDir tmp;
    write(tmp.path / "pack.yaml",
          head + "tools: [\"a\"]\nentrypoints:\n  \"a\":\n    entry: \"m:a\"\n    purity: pure\n");
    const ToolManifest m = load_pack_dir(tmp.path.string());
    REQUIRE(m.tools.size() == 1);
    CHECK(m.tools[0].runner == "python");
    CHECK(m.tools[0].entry == "m:a");
    CHECK(m.tools[0].info.deterministic);
    CHECK(m.tools[0].pack.bindings_path == (tmp.path / "pack.yaml").string());
    CHECK(m.tools[0].line == 10);  // its fields' first line
  }
}

TEST_CASE("two tools whose names make one aid are refused") {
  TempDir tmp;
  const std::string pack =
      "id: p\nname: n\nversion: v\ndescription: d\nauthor: a\nlicense: l\n"
      "tools: [\"a b\", \"a-b\"]\n";
  const std::string tools =
      "tools:\n  \"a b\": {kind: python, entry: \"m:f\"}\n  \"a-b\": {kind: python, entry: \"m:g\"}\n";
  CHECK(error_of(tmp, pack, tools).find("its aid AID.PACK.P.A_B.v1 is another tool's of this pack too") !=
        std::string::npos);
}

TEST_CASE("a pack file larger than 1 MiB is refused unread") {
  TempDir tmp;
  std::string big = kPack + "# " + std::string(1u << 20, 'x') + "\n";
  CHECK(error_of(tmp, big, kTools).find("pack.yaml: larger than 1048576 bytes") != std::string::npos);
  TempDir exact;
  std::string fits = kPack + "#";
  fits.resize(1u << 20, 'x');
  CHECK(error_of(exact, fits, kTools) == "");
}
