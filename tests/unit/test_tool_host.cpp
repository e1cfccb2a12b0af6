// ToolHost: the pipeline assembled with its runners. Calls of linked test tools on the inline
// runner (deadlines, overruns, the stuck calls the fronts see through the host), the tool
// host's teardown right after an overrun, and the one rule for the default tool set.
#include <machina/schema_validator.hpp>
#include <machina/tool_host.hpp>

#include <doctest/doctest.h>

#include "host_call.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace machina;

using machina::test::handle;
using machina::test::to;

namespace {

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
    CallerState session(true);
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

TEST_CASE("every pack tool's input schema compiles (they are checked at first call, not at start)") {
  ToolHost tools;
  const auto added = tools.add_packs({}, default_policy("/nonexistent-workspace"));
  REQUIRE(added.size() > 10);
  std::size_t with_schema = 0;
  for (const Tool* tool : tools.registry().tools()) {
    CAPTURE(tool->info.aid);
    if (tool->info.input_schema.empty()) continue;
    ++with_schema;
    const SchemaValidator* schema = nullptr;
    CHECK_NOTHROW(schema = tool->input_validator());
    CHECK(schema != nullptr);
  }
  CHECK(with_schema == added.size());
}

TEST_CASE("a keyed call whose host side throws answers internal_error and leaves its key free") {
  ToolHost tools;
  tools.add_linked_plugin(PluginEntryPoints{&test_plugin_abi, &register_bad_schema});
  Host& host = tools.host();
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
  // The watchdog thread answers the first call's overrun through an overrun sink that holds it
  // until released, as a loaded machine may keep it off the CPU: the second call's
  // deadline passes with no one to fire it, and the tool returns after it.
  struct HeldOverrunSink : OverrunSink {
    std::promise<void> entered;
    std::shared_future<void> release;
    Response delivered;
    void deliver(Response response) override {
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
  ToolHost tools(options);
  tools.add_linked_plugin(PluginEntryPoints{&test_plugin_abi, &register_sleeper});
  Host& host = tools.host();
  std::promise<void> let_go;
  HeldOverrunSink held;
  held.release = let_go.get_future().share();
  auto entered = held.entered.get_future();
  Request first = to("AID.SLEEP.v1");
  first.input_json = "300";
  first.timeout_ms = 20;
  std::thread caller([&] {
    CallerState session(true);
    const Response r = host.handle(first, session, &held);
    CHECK(r.overran);  // answered through the overrun sink
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

TEST_CASE("the fronts see the stuck inline calls through the host, a tool host goes right after an overrun") {
  // An overrun sink that records the timeout it is handed (on the watchdog thread).
  struct Recorded : OverrunSink {
    std::promise<Response> delivered;
    void deliver(Response response) override { delivered.set_value(std::move(response)); }
  };
  auto tools = std::make_unique<ToolHost>();
  tools->add_linked_plugin(PluginEntryPoints{&test_plugin_abi, &register_sleeper});
  Host& host = tools->host();
  CHECK(host.stuck_calls() == 0);
  Recorded overrun_sink;
  auto delivered = overrun_sink.delivered.get_future();
  Request slow = to("AID.SLEEP.v1");
  slow.input_json = "400";
  slow.timeout_ms = 20;
  std::promise<Response> returned;
  std::thread caller([&] {
    CallerState session(true);
    returned.set_value(host.handle(slow, session, &overrun_sink));
  });
  REQUIRE(delivered.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(delivered.get().kind == ErrorKind::timeout);
  // The tool still holds the caller's thread: the host reports it as the inline runner counts it.
  CHECK(host.stuck_calls() == 1);
  CHECK(tools->stats().stuck_now == 1);
  caller.join();
  CHECK(returned.get_future().get().overran);
  CHECK(host.stuck_calls() == 0);
  const ToolHostStats stats = tools->stats();
  CHECK(stats.timeouts == 1);
  CHECK(stats.stuck_peak == 1);
  // Torn down at once, while the watchdog thread may still be ending its round: it stops
  // before the host its callbacks reach into goes.
  tools.reset();
}

TEST_CASE("no plugin named: the built-in tools plus every pack, a plugin named: neither") {
  const PluginEntryPoints builtin{&test_plugin_abi, &register_sleeper};
  const auto has = [](const ToolHost& tools, std::string_view aid) { return tools.registry().find(aid) != nullptr; };
  std::size_t pack_tools = 0;
  {
    ToolHost all_packs;
    pack_tools = all_packs.add_packs({}, pack_policy("")).size();
    REQUIRE(pack_tools > 10);
  }
  {
    ToolChoice choice;  // nothing named
    choice.linked_builtin = builtin;
    ToolHost tools;
    const auto added = tools.load_default_tools(choice);
    CHECK(added.size() == pack_tools + 1);
    CHECK(has(tools, "AID.SLEEP.v1"));
    CHECK_FALSE(loads_plugin_libraries(choice));
  }
  {
    ToolChoice choice;  // packs named: those packs beside the built-in tools
    choice.linked_builtin = builtin;
    choice.packs = std::vector<std::string>{PackRunner::pack_names().front()};
    ToolHost tools;
    const auto added = tools.load_default_tools(choice);
    CHECK(added.size() > 1);
    CHECK(added.size() < pack_tools + 1);
    CHECK(has(tools, "AID.SLEEP.v1"));
  }
  {
    ToolChoice choice;  // no pack at all
    choice.linked_builtin = builtin;
    choice.packs = std::vector<std::string>{};
    ToolHost tools;
    CHECK(tools.load_default_tools(choice) == std::vector<std::string>{"AID.SLEEP.v1"});
  }
  {
    ToolChoice choice;  // plugins named (none here): no built-in tools, no packs
    choice.linked_builtin = builtin;
    choice.plugins = std::vector<std::string>{};
    ToolHost tools;
    CHECK(tools.load_default_tools(choice).empty());
    CHECK(tools.registry().size() == 0);
  }
  {
    ToolChoice choice;  // a plugin library, in a program that cannot load one
    choice.plugins = std::vector<std::string>{"/nonexistent/plugin.so"};
    CHECK(loads_plugin_libraries(choice));
    ToolHost tools;
    CHECK_THROWS_WITH_AS(tools.load_default_tools(choice),
                         "this program cannot load plugin libraries: /nonexistent/plugin.so", ConfigError);
  }
  {
    ToolChoice choice;  // a plugin library through the loader: its error names the file
    choice.plugins = std::vector<std::string>{"/nonexistent/plugin.so"};
    choice.load_library = &ToolHost::load_plugin;
    ToolHost tools;
    CHECK_THROWS_WITH_AS(tools.load_default_tools(choice), doctest::Contains("/nonexistent/plugin.so"), ConfigError);
  }
}

TEST_CASE("OS limits without process isolation are refused by the tool host's options") {
  HostOptions options;
  options.workers.limits.no_network = true;
  CHECK_THROWS_AS(ToolHost{options}, ConfigError);
  options.isolation = Isolation::process;
  options.workers.executable = "/bin/true";
  CHECK_NOTHROW(ToolHost{options});  // (the workers start at the first call or description)
}
