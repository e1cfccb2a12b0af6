// IdempotencyCache: single flight, conflicts, TTL, and its bounds (entries, key bytes,
// stored bytes), with running entries never evicted.
#include <machina/idempotency_cache.hpp>

#include <doctest/doctest.h>

#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace machina;
using Outcome = IdempotencyCache::Outcome;

namespace {
Response answer(std::string output) {
  Response r;
  r.output_json = std::move(output);
  return r;
}
constexpr std::string_view kInput = "{}";  // the input of most calls here
}  // namespace

TEST_CASE("a key runs once, a repeat with the same input is a hit, with another a conflict") {
  IdempotencyCache cache({});
  Response hit;
  const auto first = cache.begin("AID.A", "k", kInput, 0, hit);
  REQUIRE(first.outcome == Outcome::run);
  cache.complete(first, answer("[1]"), true, 0);
  CHECK(cache.begin("AID.A", "k", kInput, 10, hit).outcome == Outcome::hit);
  CHECK(hit.output_json == "[1]");
  CHECK(cache.begin("AID.A", "k", "{\"x\":1}", 10, hit).outcome == Outcome::conflict);
  CHECK(cache.begin("AID.B", "k", kInput, 10, hit).outcome == Outcome::run);  // keys are per tool
}

TEST_CASE("fingerprints are exact: short inputs kept as they are, long ones hashed") {
  CHECK(IdempotencyCache::fingerprint("{}") != IdempotencyCache::fingerprint("{ }"));
  const std::string long_a(100, 'a');
  std::string long_b = long_a;
  long_b[99] = 'b';
  CHECK(IdempotencyCache::fingerprint(long_a) != IdempotencyCache::fingerprint(long_b));
  CHECK(IdempotencyCache::fingerprint(long_a) == IdempotencyCache::fingerprint(std::string(100, 'a')));
}

TEST_CASE("an entry reused by a key with another input binds that input alone, not what the last one left") {
  IdempotencyCache cache({.max_entries = 1});  // each new key takes the one entry
  Response hit;
  const std::string longest_kept(32, 'x');  // the longest input kept as it is
  const std::string hashed(33, 'x');        // the shortest one hashed
  int n = 0;
  for (const std::string& before : {longest_kept, hashed}) {
    for (const std::string& input : {std::string("xx"), before, std::string("x")}) {
      // The entry last held `before` (or what the previous round left), now `input`.
      const std::string key = "k" + std::to_string(n++);
      const auto t = cache.begin("AID.A", key, input, 0, hit);
      REQUIRE(t.outcome == Outcome::run);
      cache.complete(t, answer("[" + key + "]"), true, 0);
      CHECK(cache.begin("AID.A", key, input, 1, hit).outcome == Outcome::hit);
      CHECK(hit.output_json == "[" + key + "]");
      std::string changed = input;
      changed.back() = 'y';
      for (const std::string& other : {std::string(), input + "x", changed, longest_kept, hashed, std::string("xx")}) {
        if (other != input) CHECK(cache.begin("AID.A", key, other, 1, hit).outcome == Outcome::conflict);
      }
    }
  }
}

TEST_CASE("an evicted entry that held a large response serves the next key as well") {
  IdempotencyCache cache({.max_entries = 1});
  Response hit;
  const std::string big = "\"" + std::string(10'000, 'b') + "\"";  // beyond what a freed entry keeps
  const auto first = cache.begin("AID.A", "big", kInput, 0, hit);
  cache.complete(first, answer(big), true, 0);
  REQUIRE(cache.begin("AID.A", "big", kInput, 1, hit).outcome == Outcome::hit);
  CHECK(hit.output_json == big);
  const auto next = cache.begin("AID.A", "a-much-longer-key-than-before", kInput, 2, hit);  // evicts "big"
  REQUIRE(next.outcome == Outcome::run);
  cache.complete(next, answer("[2]"), true, 2);
  Response again;
  REQUIRE(cache.begin("AID.A", "a-much-longer-key-than-before", kInput, 3, again).outcome == Outcome::hit);
  CHECK(again.output_json == "[2]");
  CHECK(cache.size() == 1);
  CHECK(cache.stored_bytes() < big.size());                                    // only the new key's response is counted
  CHECK(cache.begin("AID.A", "big", kInput, 3, hit).outcome == Outcome::run);  // "big" was evicted
}

TEST_CASE("a hit gives back the stored response's status, output, error and lease details") {
  IdempotencyCache cache({});
  Response hit;
  Response failed;
  failed.kind = ErrorKind::tool_error;
  failed.error = "the tool says no: \"quoted\"";
  failed.lease_tier = 2;
  failed.lease_aid = "AID.LEASED.v1";
  failed.lease_reason = "a reason";
  failed.trace_json = "{\"not\":\"kept\"}";
  const auto first = cache.begin("AID.A", "k", kInput, 0, hit);
  cache.complete(first, failed, true, 1);
  REQUIRE(cache.begin("AID.A", "k", kInput, 2, hit).outcome == Outcome::hit);
  CHECK(hit.kind == ErrorKind::tool_error);
  CHECK(hit.error == failed.error);
  CHECK(hit.output_json.empty());
  CHECK(hit.lease_tier == 2);
  CHECK(hit.lease_aid == "AID.LEASED.v1");
  CHECK(hit.lease_reason == "a reason");
  CHECK(hit.trace_json.empty());
  // The entry's storage is reused by the next key: a shorter response reads back whole too.
  IdempotencyCache one({.max_entries = 1});
  const auto a = one.begin("AID.A", "a", kInput, 0, hit);
  one.complete(a, failed, true, 1);
  const auto b = one.begin("AID.A", "b", kInput, 2, hit);  // evicts "a"
  REQUIRE(b.outcome == Outcome::run);
  one.complete(b, answer("[1]"), true, 3);
  Response again;
  REQUIRE(one.begin("AID.A", "b", kInput, 4, again).outcome == Outcome::hit);
  CHECK(again.kind == ErrorKind::none);
  CHECK(again.output_json == "[1]");
  CHECK(again.error.empty());
  CHECK(again.lease_aid.empty());
  CHECK(again.lease_reason.empty());
  CHECK(again.lease_tier == -1);
}

TEST_CASE("a duplicate in flight waits for the first call's answer") {
  IdempotencyCache cache({});
  Response hit;
  const auto first = cache.begin("AID.A", "k", kInput, 0, hit);
  const auto second = cache.begin("AID.A", "k", kInput, 0, hit);
  REQUIRE(second.outcome == Outcome::wait);
  std::thread finisher([&] { cache.complete(first, answer("\"done\""), true, 1); });
  const Response waited = cache.wait(second);
  finisher.join();
  CHECK(waited.output_json == "\"done\"");
}

TEST_CASE("many duplicates wait on one flight, the entry is reused at once after") {
  IdempotencyCache cache({.max_entries = 1});
  Response hit;
  const auto first = cache.begin("AID.A", "k", kInput, 0, hit);
  std::vector<IdempotencyCache::Ticket> waiting;
  for (int i = 0; i < 4; ++i) {
    waiting.push_back(cache.begin("AID.A", "k", kInput, 0, hit));
    REQUIRE(waiting.back().outcome == Outcome::wait);
    CHECK(waiting.back().slot == first.slot);  // all wait for the one call
  }
  std::vector<std::string> got(waiting.size());
  std::vector<std::thread> waiters;
  for (std::size_t i = 0; i < waiting.size(); ++i) {
    waiters.emplace_back([&, i] { got[i] = cache.wait(waiting[i]).output_json; });
  }
  cache.complete(first, answer("7"), false, 1);  // not kept: freed once the last waiter has its answer
  for (auto& t : waiters) t.join();
  for (const auto& g : got) CHECK(g == "7");
  CHECK(cache.size() == 0);
  const auto next = cache.begin("AID.A", "other", kInput, 2, hit);
  CHECK(next.outcome == Outcome::run);
  CHECK(cache.begin("AID.A", "k", kInput, 2, hit).outcome == Outcome::full);  // the one entry is running
}

TEST_CASE("a kept entry whose waiter has yet to collect its answer is not reused for a new key") {
  IdempotencyCache cache({.max_entries = 1});
  Response hit;
  const auto first = cache.begin("AID.A", "k", kInput, 0, hit);
  const auto dup = cache.begin("AID.A", "k", kInput, 0, hit);
  REQUIRE(dup.outcome == Outcome::wait);
  cache.complete(first, answer("\"first\""), true, 1);               // kept, and the waiter has not run yet
  const auto other = cache.begin("AID.A", "other", kInput, 2, hit);  // the cache is full: "k" must go
  REQUIRE(other.outcome == Outcome::run);
  CHECK(other.slot != first.slot);  // "k"'s entry still holds the waiter's answer
  CHECK(cache.wait(dup).output_json == "\"first\"");
  cache.complete(other, answer("\"other\""), true, 3);
  CHECK(cache.size() == 1);
  Response again;
  CHECK(cache.begin("AID.A", "other", kInput, 4, again).outcome == Outcome::hit);
  CHECK(again.output_json == "\"other\"");
  CHECK(cache.begin("AID.A", "k", kInput, 4, hit).outcome == Outcome::run);  // "k" was evicted: it runs again
}

TEST_CASE("the index agrees with a plain map through heavy churn") {
  // Random keys (many colliding in the low bits of a small table), kept and dropped,
  // expiring and evicted: every lookup answers as a model of the cache does.
  IdempotencyCache cache({.max_entries = 64, .ttl_ms = 50});
  struct Model {
    std::string output;
    std::int64_t expires_at;
  };
  std::map<std::string, Model> model;  // kept entries only
  std::vector<std::string> order;      // kept keys, oldest first
  std::mt19937 rng(12345);
  Response hit;
  for (int step = 0; step < 20'000; ++step) {
    const std::int64_t now = step / 40;
    const std::string key = "k" + std::to_string(rng() % 300);
    // The model's view: expired entries go first, oldest first.
    while (!order.empty() && model.at(order.front()).expires_at <= now) {
      model.erase(order.front());
      order.erase(order.begin());
    }
    const auto t = cache.begin("AID.A", key, kInput, now, hit);
    if (const auto m = model.find(key); m != model.end()) {
      REQUIRE(t.outcome == Outcome::hit);
      CHECK(hit.output_json == m->second.output);
      continue;
    }
    REQUIRE(t.outcome == Outcome::run);
    if (model.size() == 64) {  // full: the oldest kept entry made room
      model.erase(order.front());
      order.erase(order.begin());
    }
    const bool keep = rng() % 4 != 0;
    const std::string output = std::to_string(step);
    cache.complete(t, answer(output), keep, now);
    if (keep) {
      model[key] = Model{output, now + 50};
      order.push_back(key);
    }
    REQUIRE(cache.size() == model.size());
  }
  // Every byte counted in on keeping was counted out on expiry or eviction.
  CHECK(cache.stored_bytes() > 0);
  REQUIRE(cache.begin("AID.A", "last", kInput, 1'000'000, hit).outcome == Outcome::run);  // all else expired
  CHECK(cache.stored_bytes() == 0);
}

TEST_CASE("keys chosen to share a bucket under an unseeded hash do not share one here") {
  // Keys are the client's choice. With a hash anyone can compute (std::hash is murmur with a
  // fixed seed), a client can pick keys that all fall into one bucket and make every
  // lookup walk all of them: every call then costs a walk of the whole cache, and a larger
  // cache costs more. These 64 keys
  // share their low 12 bits under std::hash (which covers the index of a 64-entry cache);
  // the cache's own hash is seeded per cache and spreads them.
  std::vector<std::string> keys;
  for (unsigned long i = 0; keys.size() < 64; ++i) {
    std::string k = "k" + std::to_string(i);
    if ((std::hash<std::string_view>{}(k) & 0xFFF) == 0) keys.push_back(std::move(k));
  }
  IdempotencyCache cache({.max_entries = 64});
  Response hit;
  for (const auto& k : keys) {
    const auto t = cache.begin("AID.A", k, kInput, 0, hit);
    REQUIRE(t.outcome == Outcome::run);
    cache.complete(t, answer("1"), true, 0);
  }
  REQUIRE(cache.size() == 64);
  // 64 keys over 128 buckets at random: 9 or more in one bucket has odds below one in a million.
  CHECK(cache.longest_chain() <= 8);
  for (const auto& k : keys) CHECK(cache.begin("AID.A", k, kInput, 1, hit).outcome == Outcome::hit);
}

TEST_CASE("entries expire after the TTL") {
  IdempotencyCache cache({.max_entries = 8, .ttl_ms = 100});
  Response hit;
  const auto t = cache.begin("AID.A", "k", kInput, 0, hit);
  cache.complete(t, answer("1"), true, 0);
  CHECK(cache.begin("AID.A", "k", kInput, 99, hit).outcome == Outcome::hit);
  CHECK(cache.begin("AID.A", "k", kInput, 101, hit).outcome == Outcome::run);
}

TEST_CASE("the oldest finished entry is evicted, running entries never are") {
  IdempotencyCache cache({.max_entries = 2});
  Response hit;
  const auto a = cache.begin("AID.A", "a", kInput, 0, hit);
  cache.complete(a, answer("1"), true, 0);
  const auto b = cache.begin("AID.A", "b", kInput, 1, hit);  // running
  REQUIRE(b.outcome == Outcome::run);
  const auto c = cache.begin("AID.A", "c", kInput, 2, hit);  // evicts a (finished), not b
  REQUIRE(c.outcome == Outcome::run);
  CHECK(cache.size() == 2);
  CHECK(cache.begin("AID.A", "d", kInput, 3, hit).outcome == Outcome::full);  // b and c both running
  CHECK(cache.begin("AID.A", "b", kInput, 3, hit).outcome == Outcome::wait);  // b is still there
  cache.complete(b, answer("2"), true, 4);
  cache.complete(c, answer("3"), true, 4);
  CHECK(cache.begin("AID.A", "d", kInput, 5, hit).outcome == Outcome::run);
}

TEST_CASE("stored responses stay within the byte budget") {
  IdempotencyCache cache({.max_entries = 8, .ttl_ms = 60'000, .max_key_bytes = 1024, .max_stored_bytes = 100});
  Response hit;
  const auto big = cache.begin("AID.A", "big", kInput, 0, hit);
  cache.complete(big, answer(std::string(200, '1')), true, 0);
  CHECK(cache.stored_bytes() <= 100);
  CHECK(cache.begin("AID.A", "big", kInput, 1, hit).outcome == Outcome::run);  // not kept: runs again
  for (int i = 0; i < 8; ++i) {
    const std::string key(1, static_cast<char>('a' + i));
    const auto t = cache.begin("AID.A", key, kInput, 2, hit);
    cache.complete(t, answer(std::string(30, '2')), true, 2);
    CHECK(cache.stored_bytes() <= 100);
  }
}
