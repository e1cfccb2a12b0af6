// Idempotency: results kept per (aid, key), bound to a fingerprint of the input,
// single-flight for duplicates in flight, bounded in entries, key length and stored bytes,
// with O(1) expiry and eviction. An entry for a call still running is never evicted (a
// duplicate must wait for it, not run the tool again): when every entry is running, a new
// key is refused. Entries live in a slab that is reused, so that a call with a fresh key
// allocates nothing once the cache has warmed up.
#pragma once

#include <machina/light_mutex.hpp>
#include <machina/request.hpp>

#include <array>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace machina {

class IdempotencyCache {
 public:
  struct Options {
    std::size_t max_entries = 1024;           // as the original host (docs/protocol.md)
    std::int64_t ttl_ms = 60'000;             // as the original host
    std::size_t max_key_bytes = 1024;         // longest idempotency_key accepted
    std::size_t max_stored_bytes = 64u << 20; // responses kept, in all (a larger one is not kept)
  };
  /// What binds a key to its input: the input itself when it is at most 32 bytes (byte 0
  /// holds its length), else 0xFF and the input's SHA-256. Exact either way, short inputs
  /// without hashing.
  using Fingerprint = std::array<unsigned char, 33>;

  enum class Outcome {
    run,       // first with this key: run the tool, then complete()
    hit,       // a stored result with the same input: `response`
    wait,      // the same call is running: wait()
    conflict,  // the key was used with another input
    full       // every entry is a call still running: refuse the call (overloaded)
  };
  struct Ticket {
    Outcome outcome = Outcome::run;
    std::uint32_t slot = 0;      // run, wait: the entry
    std::uint32_t generation = 0;
  };

  explicit IdempotencyCache(Options options);

  static Fingerprint fingerprint(std::string_view input_json);

  /// On a hit, the stored response is copied into `hit` (its status, output, error and
  /// lease details; nothing else of it is kept). On any other outcome `hit` is left as it
  /// was (the host passes its fresh return object).
  Ticket begin(std::string_view aid, std::string_view key, const Fingerprint& fp, std::int64_t now_ms, Response& hit);
  /// For a `wait` ticket: the response of the call it waited for (an internal error if
  /// it could not be handed over).
  Response wait(const Ticket& ticket);
  /// For a `run` ticket: publishes the response to the duplicates waiting for it and keeps
  /// it for later hits if `keep` (and it fits the byte budget).
  void complete(const Ticket& ticket, const Response& response, bool keep, std::int64_t now_ms);

  std::size_t size() const;            // entries kept or running
  std::size_t stored_bytes() const;    // bytes of the responses kept
  const Options& options() const { return options_; }

 private:
  static constexpr std::uint32_t kNone = UINT32_MAX;
  enum class State : std::uint8_t { free, running, done, handed_off };
  /// What a hit answers with (its id and state are the request's own): the response's
  /// strings end to end in one, which keeps its capacity when the entry is reused.
  struct Result {
    ErrorKind kind = ErrorKind::none;
    int lease_tier = -1;
    std::size_t output_len = 0, error_len = 0, lease_aid_len = 0;  // the rest is the lease reason
    std::string text;

    void assign(const Response& r);
    void copy_to(Response& r) const;
  };
  struct Entry {
    std::string scope;  // aid '\0' key; keeps its capacity when the entry is reused
    std::size_t hash = 0;
    Fingerprint fp{};
    State state = State::free;
    std::uint32_t generation = 0;
    std::uint32_t waiters = 0;       // duplicates waiting for this call
    std::uint32_t chain = kNone;     // next entry in the same hash bucket
    std::uint32_t prev = kNone, next = kNone;  // the list of kept entries, oldest first
    std::int64_t expires_at = 0;
    std::size_t bytes = 0;           // counted in stored_bytes_ while kept
    Result result;                   // kept for hits
    std::shared_ptr<const Response> handoff;  // for waiters, when there are any
  };

  static std::size_t hash_of(std::string_view aid, std::string_view key) noexcept;
  std::uint32_t find(std::string_view aid, std::string_view key, std::size_t hash) const;
  std::uint32_t take_slot();
  void link_bucket(std::uint32_t slot);
  void unlink_bucket(std::uint32_t slot);
  void append_kept(std::uint32_t slot);
  void unlink_kept(std::uint32_t slot);
  void release(std::uint32_t slot);        // no longer indexed; freed once no waiter needs it
  void free_slot(std::uint32_t slot);
  bool evict_oldest();                     // false if no kept entry can go
  void prune(std::int64_t now_ms);
  void rehash(std::size_t buckets);

  Options options_;
  mutable LightMutex mu_;
  std::condition_variable_any done_;       // a call that had waiters completed
  std::vector<Entry> entries_;             // the slab (grows to max_entries)
  std::vector<std::uint32_t> buckets_;     // heads of hash chains (a power of two)
  std::uint32_t free_ = kNone;             // free entries, chained through `chain`
  std::uint32_t oldest_ = kNone, newest_ = kNone;  // kept entries, in expiry order
  std::size_t in_use_ = 0;                 // running + kept
  std::size_t kept_ = 0;
  std::size_t stored_bytes_ = 0;
};

}  // namespace machina
