// The NATS front's message forms without a server: which form a body is read as, the call
// options taken from headers, the refusals (not JSON, a timeout that is not an integer, an
// OpenAI call naming another tool than its subject's), and each form's answer and error
// headers for a host response.
#include "../../toolhost/cli/nats_message_forms.hpp"
#include "echo_tools.hpp"

#include <machina/tool_host.hpp>

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <map>
#include <string>

using namespace machina;
using cli::Form;
using cli::MessageCall;
using nlohmann::json;

namespace {

struct Reading {
  bool ok = false;
  MessageCall call;
  std::string refusal;
};

Reading read(std::string_view subject_aid, std::string_view data,
             const std::map<std::string, std::string>& headers = {}) {
  ToolHost tools{HostOptions{}};
  tools.add_linked_plugin(test::echo_tools());
  Reading r;
  const auto header = [&](const char* name) -> const char* {
    const auto it = headers.find(name);
    return it == headers.end() ? nullptr : it->second.c_str();
  };
  const std::string subject = subject_aid.empty() ? "machina.call" : "machina.tool." + std::string(subject_aid);
  r.ok = cli::read_message(tools.host().registry(), subject, subject_aid, data, header, r.call, r.refusal);
  return r;
}

std::string header_of(const cli::FormAnswer& a, const char* name) {
  for (const auto& [key, value] : a.headers)
    if (std::string_view(key) == name) return value;
  return "(none)";
}

}  // namespace

TEST_CASE("a NATS body is read as our envelope, an OpenAI call or the tool's own input") {
  const Reading envelope = read("", R"({"aid":"AID.UNIT.ECHO.v1","input_json":"{}"})");
  REQUIRE(envelope.ok);
  CHECK(envelope.call.form == Form::envelope);
  CHECK(envelope.call.request == R"({"aid":"AID.UNIT.ECHO.v1","input_json":"{}"})");  // as it came
  CHECK(envelope.call.run_aid.empty());

  const Reading openai = read("", R"({"id":"c1","function":{"name":"AID.UNIT.OTHER.v1","arguments":{"n":1}}})",
                              {{cli::kHdrUser, "ann"}, {cli::kHdrTimeoutMs, "250"}});
  REQUIRE(openai.ok);
  CHECK(openai.call.form == Form::openai);
  CHECK(openai.call.tool_call_id == "c1");
  CHECK(json::parse(openai.call.request) ==
        json{{"aid", "AID.UNIT.OTHER.v1"}, {"input_json", R"({"n":1})"}, {"user", "ann"}, {"timeout_ms", 250}});

  const Reading own = read("AID.UNIT.ECHO.v1", R"({"n":2})", {{cli::kHdrIdempotencyKey, "k1"}, {cli::kHdrLease, "L"}});
  REQUIRE(own.ok);
  CHECK(own.call.form == Form::tool_input);
  CHECK(json::parse(own.call.request) == json{{"aid", "AID.UNIT.ECHO.v1"},
                                              {"input_json", R"({"n":2})"},
                                              {"idempotency_key", "k1"},
                                              {"_lease_token", "L"}});

  const Reading on_subject = read("AID.UNIT.ECHO.v1", R"({"input_json":"{}"})");
  REQUIRE(on_subject.ok);
  CHECK(on_subject.call.form == Form::envelope);
  CHECK(on_subject.call.run_aid == "AID.UNIT.ECHO.v1");
}

TEST_CASE("a NATS body that cannot be a call is refused in its subject's form") {
  const Reading not_json = read("", "{nope");
  CHECK_FALSE(not_json.ok);
  CHECK(json::parse(not_json.refusal).at("code") == "malformed_request");
  CHECK(json::parse(not_json.refusal).at("error") == "malformed request: the body is not JSON");

  const Reading timeout = read("", "{}", {{cli::kHdrTimeoutMs, "soon"}});
  CHECK_FALSE(timeout.ok);
  CHECK(json::parse(timeout.refusal).at("error") == "malformed request: Machina-Timeout-Ms is not an integer");

  const Reading other = read("AID.UNIT.ECHO.v1", R"({"function":{"name":"AID.UNIT.OTHER.v1"}})");
  CHECK_FALSE(other.ok);
  CHECK(other.call.form == Form::openai);
  CHECK(json::parse(other.refusal).at("error").get<std::string>().find("is not the tool of subject") !=
        std::string::npos);

  const Reading arguments = read("", R"({"function":{"name":"AID.UNIT.ECHO.v1","arguments":[1]}})");
  CHECK_FALSE(arguments.ok);
  CHECK(json::parse(arguments.refusal).at("error") == "malformed request: function.arguments must be a JSON string");

  const Reading array = read("", "[1]");
  CHECK_FALSE(array.ok);
  CHECK(array.call.form == Form::envelope);
}

TEST_CASE("each NATS form answers a host response in its own shape, failures with error headers") {
  const std::string ok_line = R"({"ok":true,"status":"OK","output_json":"{\"n\":1}"})";
  const std::string failed = R"({"ok":false,"status":"TIMEOUT","code":"timeout","error":"took too long"})";
  MessageCall call;

  call.form = Form::envelope;
  const cli::FormAnswer envelope = cli::answer_in_form(call, failed);
  CHECK(envelope.body == failed);
  CHECK_FALSE(envelope.ok);
  CHECK(header_of(envelope, cli::kHdrErrorCode) == "504");
  CHECK(header_of(envelope, cli::kHdrWireCode) == "timeout");
  CHECK(header_of(envelope, cli::kHdrError) == "took too long");

  call.form = Form::tool_input;
  CHECK(json::parse(cli::answer_in_form(call, ok_line).body) == json{{"data", {{"n", 1}}}, {"error", nullptr}});
  const cli::FormAnswer own_failed = cli::answer_in_form(call, failed);
  CHECK(json::parse(own_failed.body).at("error") == "Timeout: took too long");

  call.form = Form::openai;
  call.tool_call_id = "c9";
  call.function_name = "echo_it";
  const cli::FormAnswer openai = cli::answer_in_form(call, R"({"ok":true,"output_json":"\"plain text\""})");
  CHECK(openai.ok);
  CHECK(openai.headers.empty());
  CHECK(json::parse(openai.body) ==
        json{{"tool_call_id", "c9"}, {"role", "tool"}, {"name", "echo_it"}, {"content", "plain text"}});
  CHECK(json::parse(cli::answer_in_form(call, failed).body).at("content") == "Error: took too long");
}
