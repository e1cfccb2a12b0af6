// container_invocation: the runtime's command line for one call's container, and which
// guarantee each of its flags enforces; no flag for a guarantee the tool does not require;
// which image references are refused.
#include <machina/runners/container_runner.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

using namespace machina;

namespace {

bool has(const std::vector<std::string>& argv, const std::vector<std::string>& words) {
  return std::search(argv.begin(), argv.end(), words.begin(), words.end()) != argv.end();
}

ContainerToolFields fields(const std::string& runtime) {
  ContainerToolFields f;
  f.runtime = "/usr/bin/" + runtime;
  f.runtime_name = runtime;
  f.image = "localhost/tools:1";
  f.command = default_container_command();
  return f;
}

}  // namespace

TEST_CASE("a tool requiring nothing: no privileges, nothing of the host, no confinement flags") {
  const ContainerInvocation inv = container_invocation(fields("podman"), "machina-call-1");
  const std::vector<std::string> head = {"podman", "run", "--rm", "-i", "--name", "machina-call-1"};
  CHECK(std::vector<std::string>(inv.argv.begin(), inv.argv.begin() + 6) == head);
  CHECK(has(inv.argv, {"--cap-drop", "all"}));
  CHECK(has(inv.argv, {"--security-opt", "no-new-privileges"}));
  CHECK_FALSE(has(inv.argv, {"--network", "none"}));
  CHECK_FALSE(has(inv.argv, {"--read-only"}));
  CHECK_FALSE(has(inv.argv, {"--pids-limit", "1"}));
  CHECK(has(inv.argv, {"localhost/tools:1", "python", "-m", "namel3ss_tools.runner"}));
  CHECK(inv.argv.back() == "namel3ss_tools.runner");  // the image and its command come last
  CHECK(inv.enforced.count("no_env_read") == 1);
  CHECK(inv.enforced.count("no_filesystem_read") == 1);
  CHECK(inv.enforced.count("no_network") == 0);
}

TEST_CASE("each required guarantee is a flag, and the memory limit and variables are passed") {
  for (const std::string runtime : {"podman", "docker"}) {
    CAPTURE(runtime);
    ContainerToolFields f = fields(runtime);
    f.guarantees = {{"no_network", true}, {"no_filesystem_write", true}, {"no_subprocess", true}};
    f.memory_mb = 256;
    f.env = {{"GREETING", "hi there"}};
    f.pass_env = {"API_KEY"};
    const ContainerInvocation inv = container_invocation(f, "c", 35);
    CHECK(has(inv.argv, {"--network", "none"}));
    CHECK(has(inv.argv, {"--read-only", "--ipc", "none"}));
    CHECK(has(inv.argv, {"--timeout", "35"}) == (runtime == "podman"));  // docker's run has no such limit
    CHECK(has(inv.argv, {"--env", "API_KEY"}));
    CHECK(inv.enforced.count("no_env_read") == 0);  // a secret is passed
    CHECK(has(inv.argv, {"--read-only-tmpfs=false"}) == (runtime == "podman"));
    CHECK(has(inv.argv, {"--pids-limit", "1"}));
    CHECK(has(inv.argv, {"--memory", "256m"}));
    CHECK(has(inv.argv, {"--env", "GREETING=hi there"}));
    for (const char* g : {"no_network", "no_filesystem_write", "no_subprocess"}) CHECK(inv.enforced.count(g) == 1);
  }
}

TEST_CASE("a guarantee set to false adds no flag") {
  ContainerToolFields f = fields("podman");
  f.guarantees = {{"no_network", false}};
  CHECK_FALSE(has(container_invocation(f, "c").argv, {"--network", "none"}));
}

TEST_CASE("an image reference the runtime would read as a flag, or with white space, is refused") {
  CHECK(container_image_problem("localhost/tools:1").empty());
  CHECK(container_image_problem("ghcr.io/team/tools@sha256:0123").empty());
  CHECK(container_image_problem("--privileged").find("starts with '-'") != std::string::npos);
  CHECK(container_image_problem("-v").find("starts with '-'") != std::string::npos);
  CHECK_FALSE(container_image_problem("img 1").empty());
  CHECK_FALSE(container_image_problem("img\n").empty());
  CHECK_FALSE(container_image_problem("").empty());
  for (const char* local : {"oci-archive:/tmp/x.tar", "docker-archive:/tmp/x.tar", "dir:/etc", "oci:/srv/layout"}) {
    CAPTURE(local);
    CHECK(container_image_problem(local).find("names the transport") != std::string::npos);
  }
  CHECK(container_image_problem("docker://docker.io/library/python:3").empty());
  CHECK(container_image_problem("localhost:5000/tools:1").empty());
}

TEST_CASE("only plain names are variables a container gets") {
  for (const char* name : {"HOME", "_X", "API_KEY_2"}) {
    CAPTURE(name);
    CHECK(container_variable_problem(name).empty());
  }
  for (const std::string& name : {std::string("*"), std::string("A-B"), std::string("2X"), std::string(""),
                                  std::string("HOME\0x", 6), std::string("A=B"), std::string("A B")}) {
    CAPTURE(name);
    CHECK_FALSE(container_variable_problem(name).empty());
  }
}
