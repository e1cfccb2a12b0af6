// InlineRunner: a linked tool runs on the caller's thread; at its deadline the host is told
// (Overrun) on the watchdog's thread while the tool still runs, the run then ends `late`
// and the call counts as stuck meanwhile; at max_stuck_calls new calls are refused.
#include <machina/call_context.hpp>
#include <machina/clock.hpp>
#include <machina/runners/inline_runner.hpp>
#include <machina/tool.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace machina;

namespace {

// Sleeps as many milliseconds as its input says, then echoes it.
int sleep_for_input(void*, const machina_host_api* api, machina_call* call, const char* input,
                    std::size_t len) noexcept {
  std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(std::string(input, len).c_str())));
  return api->set_output(call, input, len) == 0 ? MACHINA_TOOL_OK : MACHINA_TOOL_FAULT;
}

// Holds the calling thread until `release` is set (at most 10 s, a guard against a hang).
std::atomic<bool> release{false};
int hold(void*, const machina_host_api*, machina_call*, const char*, std::size_t) noexcept {
  const std::int64_t give_up = steady_now_ms() + 10'000;
  while (!release.load() && steady_now_ms() < give_up) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  return MACHINA_TOOL_OK;
}

struct CountingOverrun final : Overrun {
  std::atomic<int> calls{0};
  std::atomic<bool> on_caller_thread{false};
  std::thread::id caller;
  void overrun() noexcept override {
    calls.fetch_add(1);
    if (std::this_thread::get_id() == caller) on_caller_thread = true;
  }
};

std::unique_ptr<Tool> make_tool(machina_tool_fn fn) {
  auto tool = std::make_unique<Tool>(CircuitBreaker::Options{});
  tool->info.aid = "AID.UNIT.INLINE.v1";
  tool->invoke = fn;
  return tool;
}

RunOutcome run(InlineRunner& runner, const Tool& tool, const std::string& input, std::int64_t timeout_ms,
               CountingOverrun& overrun, CallContext& ctx) {
  overrun.caller = std::this_thread::get_id();
  const RunSpec spec{tool, input, steady_now_ms() + timeout_ms, timeout_ms, ctx, &overrun};
  return runner.run(spec);
}

}  // namespace

TEST_CASE("a tool that returns in time runs on the caller's thread, its output kept") {
  std::vector<std::string> events;
  InlineRunner runner(4, [&](std::string_view e) { events.emplace_back(e); });
  const auto tool = make_tool(&sleep_for_input);
  CountingOverrun overrun;
  CallContext ctx(1024, std::make_shared<const Slots>());
  const RunOutcome out = run(runner, *tool, "1", 10'000, overrun, ctx);
  CHECK(out.ending == RunOutcome::Ending::ran);
  CHECK(out.rc == MACHINA_TOOL_OK);
  CHECK(ctx.output == "1");
  CHECK(overrun.calls.load() == 0);
  CHECK(runner.stuck_now() == 0);
  CHECK(events.empty());
  CHECK(runner.kind() == "inline");
}

TEST_CASE("past its deadline the host is told on another thread, the run ends late and is counted stuck") {
  std::vector<std::string> events;
  std::mutex events_mu;
  InlineRunner runner(4, [&](std::string_view e) {
    std::lock_guard lock(events_mu);
    events.emplace_back(e);
  });
  const auto tool = make_tool(&hold);
  release = false;
  CountingOverrun overrun;
  CallContext ctx(1024, std::make_shared<const Slots>());
  auto done = std::async(std::launch::async, [&] { return run(runner, *tool, "{}", 20, overrun, ctx); });
  // The overrun comes while the tool still holds the thread.
  const std::int64_t give_up = steady_now_ms() + 10'000;
  while (overrun.calls.load() == 0 && steady_now_ms() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  REQUIRE(overrun.calls.load() == 1);
  CHECK(runner.stuck_now() == 1);
  CHECK(runner.stuck_peak() == 1);
  release = true;
  const RunOutcome out = done.get();
  CHECK(out.ending == RunOutcome::Ending::overran);
  CHECK_FALSE(overrun.on_caller_thread.load());
  CHECK(runner.stuck_now() == 0);
  CHECK(runner.stuck_peak() == 1);
  std::lock_guard lock(events_mu);
  REQUIRE(events.size() == 2);
  CHECK(events[0].find("overran its 20 ms deadline") != std::string::npos);
  CHECK(events[1].find("returned after its deadline") != std::string::npos);
}

TEST_CASE("at max_stuck_calls stuck calls a new call is refused overloaded") {
  InlineRunner runner(1, nullptr);
  const auto held = make_tool(&hold);
  const auto quick = make_tool(&sleep_for_input);
  release = false;
  CountingOverrun overrun;
  CallContext ctx(1024, std::make_shared<const Slots>());
  auto stuck = std::async(std::launch::async, [&] { return run(runner, *held, "{}", 20, overrun, ctx); });
  const std::int64_t give_up = steady_now_ms() + 10'000;
  while (runner.stuck_now() == 0 && steady_now_ms() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  REQUIRE(runner.stuck_now() == 1);
  CountingOverrun other;
  CallContext other_ctx(1024, std::make_shared<const Slots>());
  const RunOutcome refused = run(runner, *quick, "0", 10'000, other, other_ctx);
  CHECK(refused.ending == RunOutcome::Ending::overloaded);
  CHECK(refused.detail.find("1 calls are stuck") != std::string::npos);
  release = true;
  CHECK(stuck.get().ending == RunOutcome::Ending::overran);
  CallContext again_ctx(1024, std::make_shared<const Slots>());
  CHECK(run(runner, *quick, "0", 10'000, other, again_ctx).ending == RunOutcome::Ending::ran);
}
