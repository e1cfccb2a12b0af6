// The inline runner: a native plugin tool called on the caller's own thread (the fastest
// way a tool can run, and the least guarded: a crash takes the host with it). Nothing can
// safely stop a thread inside a tool, so at the deadline the host answers without it
// (Overrun) and the thread is counted as stuck until the tool gives it back; at
// max_stuck_calls new calls are refused.
#pragma once

#include <machina/deadline_watchdog.hpp>
#include <machina/runner.hpp>

#include <atomic>
#include <cstdint>

namespace machina {

class InlineRunner final : public Runner {
 public:
  InlineRunner(std::size_t max_stuck_calls, EventSink on_event);

  RunOutcome run(const RunSpec& spec) override;
  std::string_view kind() const override { return "inline"; }

  /// Calls still running past their deadline (their threads cannot be stopped).
  std::uint64_t stuck_now() const { return stuck_now_.load(std::memory_order_relaxed); }
  /// The counter stuck_now() reads, for a reader that holds no InlineRunner (Host::set_stuck_counter).
  const std::atomic<std::uint64_t>& stuck_counter() const { return stuck_now_; }
  std::uint64_t stuck_peak() const { return stuck_peak_.load(std::memory_order_relaxed); }

 private:
  struct Watched;
  static void on_deadline(DeadlineWatchdog::Watch& watch);

  std::size_t max_stuck_calls_;
  EventSink on_event_;
  std::atomic<std::uint64_t> stuck_now_{0}, stuck_peak_{0};
  DeadlineWatchdog watchdog_;  // last: stopped first, before anything its callbacks use
};

}  // namespace machina
