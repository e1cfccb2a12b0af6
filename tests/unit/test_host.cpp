// Host::handle: the request's own rules hold for every front, including one that builds
// a Request itself (no decoder ran), and the response keeps the request's ds_state form.
#include <machina/host.hpp>
#include <machina/json_text.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace machina;

namespace {
Response handle(Host& host, Request req) {
  Session session(true);
  return host.handle(req, session);
}
Request to(std::string aid) {
  Request r;
  r.aid = std::move(aid);
  return r;
}

/// The ABI version of the linked test plugins below.
std::uint32_t test_plugin_abi() {
  return MACHINA_PLUGIN_ABI_VERSION;
}
/// Registers one tool of a linked test plugin.
int add_test_tool(const machina_registrar_api* api, machina_registrar* registrar, const char* aid,
                  const char* input_schema, machina_tool_fn invoke) {
  machina_tool_desc d{};
  d.struct_size = sizeof d;
  d.aid = aid;
  d.name = aid;
  d.description = "a tool of the unit tests";
  d.input_schema = input_schema;
  d.invoke = invoke;
  return api->add_tool(registrar, &d);
}

// A linked plugin with one tool whose input schema does not compile: linked tools' schemas
// are compiled at a tool's first call, so that call throws inside the host, after its
// idempotency key has been taken.
int never_runs(void*, const machina_host_api*, machina_call*, const char*, std::size_t) noexcept {
  return MACHINA_TOOL_OK;
}
int register_bad_schema(const machina_registrar_api* api, machina_registrar* registrar) {
  return add_test_tool(api, registrar, "AID.BAD_SCHEMA.v1", R"({"type":"object","patternProperties":{}})", &never_runs);
}

// A linked tool that sleeps for as many milliseconds as its input says, then echoes it.
int sleep_for_input(void*, const machina_host_api* api, machina_call* call, const char* input,
                    std::size_t len) noexcept {
  std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(std::string(input, len).c_str())));
  return api->set_output(call, input, len) == 0 ? MACHINA_TOOL_OK : MACHINA_TOOL_FAULT;
}
int register_sleeper(const machina_registrar_api* api, machina_registrar* registrar) {
  return add_test_tool(api, registrar, "AID.SLEEP.v1", nullptr, &sleep_for_input);
}

/// Host::handle on another thread, failing the test run outright if it does not return
/// (a key left running would make a later call with it wait for good).
Response handle_within(Host& host, Request req, std::chrono::seconds limit) {
  std::promise<Response> done;
  auto answer = done.get_future();
  std::thread caller([&host, req, done = std::move(done)]() mutable {
    Session session(true);
    done.set_value(host.handle(req, session));
  });
  if (answer.wait_for(limit) != std::future_status::ready) {
    std::fprintf(stderr, "Host::handle did not return within %lld s\n", static_cast<long long>(limit.count()));
    std::abort();
  }
  caller.join();
  return answer.get();
}
}  // namespace

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

TEST_CASE("every pack tool's input schema compiles (they are checked at first call, not at start)") {
  Host host;
  const auto added = host.add_packs({}, default_policy("/nonexistent-workspace"));
  REQUIRE(added.size() > 10);
  std::size_t with_schema = 0;
  for (const Tool* tool : host.registry().tools()) {
    CAPTURE(tool->info.aid);
    if (tool->info.input_schema.empty()) continue;
    ++with_schema;
    const SchemaValidator* schema = nullptr;
    CHECK_NOTHROW(schema = tool->input_validator());
    CHECK(schema != nullptr);
  }
  CHECK(with_schema == added.size());
}

TEST_CASE("a deferred schema that does not compile throws when first used (Host::handle answers internal_error)") {
  Tool bad(CircuitBreaker::Options{});
  bad.info.aid = "AID.BAD.v1";
  bad.info.input_schema = R"({"type":"object","patternProperties":{}})";
  CHECK_NOTHROW(bad.compile_schema(/*defer=*/true));
  CHECK_THROWS_AS(bad.input_validator(), HostError);
  CHECK_THROWS_AS(bad.compile_schema(/*defer=*/false), HostError);
}

TEST_CASE("a keyed call whose host side throws answers internal_error and leaves its key free") {
  Host host;
  host.add_linked_plugin(PluginEntryPoints{&test_plugin_abi, &register_bad_schema});
  Request call = to("AID.BAD_SCHEMA.v1");
  call.input_json = "{}";
  call.idempotency_key = "retry-me";
  for (int attempt = 0; attempt < 2; ++attempt) {  // the retry runs again: nothing was kept, nothing waits
    CAPTURE(attempt);
    const Response r = handle_within(host, call, std::chrono::seconds(10));
    CHECK(r.kind == ErrorKind::internal_error);
    CHECK(r.error.starts_with("internal error: "));
    CHECK_FALSE(r.idempotent_hit);
  }
  call.input_json = R"({"other":1})";  // a key still held (kept or left running) would answer idempotency_conflict
  CHECK(handle_within(host, call, std::chrono::seconds(10)).kind == ErrorKind::internal_error);
}

TEST_CASE("a call that returns past its deadline is a timeout even when the watchdog could not fire") {
  // The watchdog thread answers the first call's overrun through a takeover that holds it
  // until released, as a loaded machine may keep it off the CPU: the second call's
  // deadline passes with no one to fire it, and the tool returns after it.
  struct HeldTakeover : Takeover {
    std::promise<void> entered;
    std::shared_future<void> release;
    Response delivered;
    void deliver_overrun(Response response) override {
      delivered = std::move(response);
      entered.set_value();
      release.wait();
    }
  };
  std::mutex events_mu;
  std::vector<std::string> events;
  HostOptions options;
  options.on_event = [&](std::string_view line) {
    std::lock_guard lock(events_mu);
    events.emplace_back(line);
  };
  Host host(options);
  host.add_linked_plugin(PluginEntryPoints{&test_plugin_abi, &register_sleeper});
  std::promise<void> let_go;
  HeldTakeover held;
  held.release = let_go.get_future().share();
  auto entered = held.entered.get_future();
  Request first = to("AID.SLEEP.v1");
  first.input_json = "300";
  first.timeout_ms = 20;
  std::thread caller([&] {
    Session session(true);
    const Response r = host.handle(first, session, &held);
    CHECK(r.abandoned);  // answered through the takeover
  });
  REQUIRE(entered.wait_for(std::chrono::seconds(10)) == std::future_status::ready);  // the watchdog is held
  CHECK(held.delivered.kind == ErrorKind::timeout);

  Request second = to("AID.SLEEP.v1");
  second.input_json = "80";
  second.timeout_ms = 20;
  const Response late = handle(host, second);
  CHECK(late.kind == ErrorKind::timeout);
  CHECK(late.error.find("returned after its deadline") != std::string::npos);
  CHECK(late.output_json.empty());
  {
    std::lock_guard lock(events_mu);
    CHECK(std::count(events.begin(), events.end(),
                     "AID.SLEEP.v1 returned after its deadline before it could be stopped; answered timeout") == 1);
  }

  Request on_time = to("AID.SLEEP.v1");
  on_time.input_json = "1";
  on_time.timeout_ms = 5'000;
  CHECK(handle(host, on_time).ok());  // (the watchdog still held: a call within its deadline is answered)
  let_go.set_value();
  caller.join();
}
