// See inline_runner.hpp.
#include <machina/clock.hpp>
#include <machina/runners/inline_runner.hpp>
#include <machina/tool_registry.hpp>

#include <string>

namespace machina {

/// A call being watched; lives on the calling thread's stack.
struct InlineRunner::Watched {
  DeadlineWatchdog::Watch watch;
  InlineRunner* runner;
  const RunSpec* spec;
};

InlineRunner::InlineRunner(std::size_t max_stuck_calls, EventSink on_event)
    : max_stuck_calls_(max_stuck_calls), on_event_(std::move(on_event)) {}

RunOutcome InlineRunner::run(const RunSpec& spec) {
  const Tool& tool = spec.tool;
  if (stuck_now() >= max_stuck_calls_) {
    return {RunOutcome::Ending::overloaded, 0,
            "overloaded: " + std::to_string(max_stuck_calls_) +
                " calls are stuck in tools past their deadline; new calls are refused until some return"};
  }
  Watched w{{}, this, &spec};
  w.watch.deadline_ms = spec.deadline_ms;
  w.watch.fire = &InlineRunner::on_deadline;
  w.watch.context = &w;
  watchdog_.arm(w.watch);
  const int rc =
      tool.invoke(tool.tool_data, &host_api(), spec.call.as_call(), spec.input_json.data(), spec.input_json.size());
  // (The watchdog may not have had a CPU at the deadline, on a loaded machine: the host
  // answers a call that returns past its deadline `timeout` all the same.)
  if (watchdog_.disarm(w.watch)) return {RunOutcome::Ending::ran, rc, {}};
  // The deadline won: the call was answered `timeout`; what the tool did is discarded.
  stuck_now_.fetch_sub(1, std::memory_order_relaxed);
  if (on_event_) on_event_(tool.info.aid + " returned after its deadline; its result was discarded");
  return {RunOutcome::Ending::overran, rc, {}};
}

void InlineRunner::on_deadline(DeadlineWatchdog::Watch& watch) {
  Watched& w = *static_cast<Watched*>(watch.context);
  InlineRunner& self = *w.runner;
  const std::uint64_t stuck = self.stuck_now_.fetch_add(1, std::memory_order_relaxed) + 1;
  for (std::uint64_t peak = self.stuck_peak_.load();
       stuck > peak && !self.stuck_peak_.compare_exchange_weak(peak, stuck);) {
  }
  // Logged before the call is answered: once the timeout is delivered, the front may end
  // the process (its input over) before a line written after it.
  if (self.on_event_) {
    self.on_event_(w.spec->tool.info.aid + " overran its " + std::to_string(w.spec->timeout_ms) +
                   " ms deadline; its thread is stuck in the tool (" + std::to_string(stuck) + " stuck, at most " +
                   std::to_string(self.max_stuck_calls_) + ")");
  }
  w.spec->overrun->overrun();
}

}  // namespace machina
