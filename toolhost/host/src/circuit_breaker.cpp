// Rolling-window breaker; see circuit_breaker.hpp.
#include <machina/circuit_breaker.hpp>

namespace machina {

bool CircuitBreaker::allow(std::int64_t now_ms) const noexcept {
  const std::int64_t until = open_until_.load(std::memory_order_relaxed);
  return until == 0 || now_ms >= until;
}

void CircuitBreaker::record_failure(std::int64_t now_ms) {
  std::lock_guard lock(mu_);
  if (open_until_.load(std::memory_order_relaxed) != 0) {
    // A failure after the cool-down (calls are let through again) re-opens it at once.
    open_until_.store(now_ms + options_.cooldown_ms, std::memory_order_relaxed);
    return;
  }
  failures_.push_back(now_ms);
  while (!failures_.empty() && failures_.front() <= now_ms - options_.window_ms) failures_.pop_front();
  if (failures_.size() >= options_.threshold) {
    failures_.clear();
    open_until_.store(now_ms + options_.cooldown_ms, std::memory_order_relaxed);
  }
  while (failures_.size() > options_.threshold) failures_.pop_front();
}

void CircuitBreaker::record_success(std::int64_t now_ms) noexcept {
  const std::int64_t until = open_until_.load(std::memory_order_relaxed);
  if (until == 0 || now_ms < until) return;  // closed, or a call that began before it opened
  std::lock_guard lock(mu_);
  open_until_.store(0, std::memory_order_relaxed);
  failures_.clear();
}

}  // namespace machina
