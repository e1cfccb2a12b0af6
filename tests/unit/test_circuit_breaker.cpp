// CircuitBreaker: trips on `threshold` failures within the window, stays open for the
// cool-down, then lets calls through until one fails (re-opens) or succeeds (closes).
#include <machina/circuit_breaker.hpp>

#include <doctest/doctest.h>

using namespace machina;

TEST_CASE("the breaker trips on failures within the window only") {
  CircuitBreaker b({.threshold = 3, .window_ms = 100, .cooldown_ms = 50});
  b.record_failure(0);
  b.record_failure(10);
  b.record_failure(200);  // the first two are out of the window by now
  CHECK(b.allow(200));
  b.record_failure(210);
  b.record_failure(220);
  CHECK_FALSE(b.allow(221));
  CHECK(b.engaged());
}

TEST_CASE("after the cool-down one failure re-opens it, one success closes it") {
  CircuitBreaker b({.threshold = 2, .window_ms = 1000, .cooldown_ms = 50});
  b.record_failure(0);
  b.record_failure(1);
  CHECK_FALSE(b.allow(50));
  CHECK(b.allow(52));
  b.record_failure(53);
  CHECK_FALSE(b.allow(60));
  CHECK(b.allow(104));
  b.record_success(104);
  CHECK_FALSE(b.engaged());
  b.record_failure(105);
  CHECK(b.allow(106));  // one failure after closing is not a trip
}
