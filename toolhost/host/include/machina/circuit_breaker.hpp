// Per-tool circuit breaker over host-side failures (faults, oversized or invalid
// output; later crashes and timeouts). A tool's own TOOL_ERROR never counts.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>

namespace machina {

class CircuitBreaker {
 public:
  struct Options {
    std::uint32_t threshold = 5;        // failures within the window that trip it
    std::int64_t window_ms = 30'000;    // rolling window
    std::int64_t cooldown_ms = 10'000;  // open for this long; then calls pass until one fails
  };

  explicit CircuitBreaker(Options options) : options_(options) {}

  /// False while open. After the cool-down every call is let through again (not
  /// just one trial call) until one fails: that host-side failure re-opens it at once,
  /// a success closes it.
  bool allow(std::int64_t now_ms) const noexcept;
  void record_failure(std::int64_t now_ms);
  void record_success(std::int64_t now_ms) noexcept;
  /// True while open or after a trip not yet closed by a success (record_success matters).
  bool engaged() const noexcept { return open_until_.load(std::memory_order_relaxed) != 0; }

 private:
  Options options_;
  std::atomic<std::int64_t> open_until_{0};  // 0: closed
  std::mutex mu_;
  std::deque<std::int64_t> failures_;  // at most `threshold` timestamps
};

}  // namespace machina
