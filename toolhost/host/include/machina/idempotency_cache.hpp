// Idempotency: results kept per (aid, key), bound to a fingerprint of the input,
// single-flight for duplicates in flight, bounded in entries, key length and stored bytes,
// with O(1) expiry and eviction. An entry for a call still running is never evicted (a
// duplicate must wait for it, not run the tool again): when every entry is running, a new
// key is refused.
//
// Built for clients that put a fresh key on every call: a lookup that finds nothing reads
// only the index (hash chains linked through an array of their own), not the entries; an entry
// keeps its scope and its result in one buffer that is reused by the next key (no
// allocation per call once warm); kept entries expire and are evicted strictly oldest
// first, so they form a singly linked queue; a flight (what a duplicate waits on) is made
// only when a duplicate arrives. Keys are hashed with XXH3 under a seed drawn per cache, so
// that keys which pile up in one bucket cannot be precomputed by a client.
//
// The host's own store (IdempotencyStore): the host calls it as this class, not through the
// interface, so that a fresh key costs no indirect call.
#pragma once

#include <machina/idempotency_store.hpp>
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

class IdempotencyCache final : public IdempotencyStore {
 public:
  struct Options {
    std::size_t max_entries = 1024;            // the dispatch contract's bound (docs/protocol.md)
    std::int64_t ttl_ms = 60'000;              // the dispatch contract's expiry
    std::size_t max_key_bytes = 1024;          // longest idempotency_key accepted
    std::size_t max_stored_bytes = 64u << 20;  // responses kept, in all (a larger one is not kept)
  };
  /// What binds a key to its input: the input itself when it is at most 32 bytes (byte 0
  /// holds its length), else 0xFF and the input's SHA-256. Exact either way, short inputs
  /// without hashing.
  using Fingerprint = std::array<unsigned char, 33>;

  // Outcomes (IdempotencyStore::Outcome): run, hit (a stored result with the same input),
  // wait, conflict, full (every entry is a call still running); never `answered`. A
  // ticket's slot is its entry.

  explicit IdempotencyCache(Options options);

  static Fingerprint fingerprint(std::string_view input_json);

  /// The call of tool `aid` with `key` and the input `input_json` (bound to the key by
  /// its fingerprint(), made here: a long input is hashed before the lock is taken). On a
  /// hit, the stored response is copied into `hit` (its status, output, error and lease
  /// details; nothing else of it is kept). On any other outcome `hit` is left as it was
  /// (the host passes its fresh return object).
  Ticket begin(std::string_view aid, std::string_view key, std::string_view input_json, std::int64_t now_ms,
               Response& hit);
  Ticket begin(const KeyedCall& call, Response& hit) override {
    return begin(call.aid, call.key, call.input_json, call.now_ms, hit);
  }
  /// For a `wait` ticket: the response of the call it waited for (an internal error if
  /// it could not be handed over).
  Response wait(const Ticket& ticket);
  /// wait() as the interface has it: always `hit`, the response in `answer`.
  Ticket wait(const Ticket& ticket, Response& answer) override {
    answer = wait(ticket);
    return Ticket{Outcome::hit};
  }
  /// For a `run` ticket: publishes the response to the duplicates waiting for it and keeps
  /// it for later hits if `keep` (and it fits the byte budget).
  /// Never throws (out of memory: the result is not kept, waiters get an internal error),
  /// so that an entry is never left running.
  void complete(const Ticket& ticket, const Response& response, bool keep, std::int64_t now_ms) noexcept override;

  std::size_t size() const;          // entries kept or running
  std::size_t stored_bytes() const;  // bytes of the responses kept
  /// The most entries that share a bucket of the index (what a lookup may have to walk):
  /// for tests and diagnostics.
  std::size_t longest_chain() const;
  const Options& options() const { return options_; }

 private:
  static constexpr std::uint32_t kNone = UINT32_MAX;
  /// Buckets for `entries` entries, at least. A fresh key walks its whole chain, and an
  /// evicted entry is unlinked from its own, so each walk's length is a branch the
  /// processor guesses wrong about as often as chains differ: with 8 buckets an entry most
  /// chains are empty, so the walk is rarely mispredicted. That holds while the index stays
  /// in the processor's caches (up to 8192 entries: 256 KiB of buckets); beyond, a lookup
  /// waits for memory whatever the chain, and a larger index only misses more: 2 an entry.
  static constexpr std::size_t buckets_for(std::size_t entries) noexcept {
    return entries <= 8192 ? entries * 8 : entries * 2;
  }
  static bool is_hashed(std::string_view input_json) noexcept {
    return input_json.size() >= std::tuple_size_v<Fingerprint>;
  }
  static Fingerprint digest(std::string_view input_json);  // fingerprint() of a long input
  /// fingerprint() of a short input, written in place (all of `fp`).
  static void write_short(Fingerprint& fp, std::string_view input_json) noexcept;
  enum class State : std::uint8_t { free, running, done, handed_off };
  /// Bytes owned by an entry, reused from key to key: grows as needed, never shrinks
  /// except when freed large (see free_slot).
  struct Buffer {
    std::unique_ptr<char[]> bytes;
    std::size_t capacity = 0;
    /// Room for `n` bytes, keeping the first `keep` of what is there.
    void reserve(std::size_t n, std::size_t keep);
  };
  struct Entry {
    // What prune() and a key comparison read lie in the first 64 bytes.
    std::uint32_t next = kNone;  // the free list, or the queue of kept entries (towards the newest)
    std::uint32_t waiters = 0;   // duplicates waiting for this call
    State state = State::free;
    ErrorKind kind = ErrorKind::none;  // the kept result's
    std::int64_t expires_at = 0;
    std::size_t aid_len = 0, key_len = 0;
    Buffer data;  // aid, key, output, error, lease aid, lease reason, end to end
    Fingerprint fp{};
    int lease_tier = -1;  // the kept result's
    // The kept result's parts, after the aid and the key in `data`.
    std::size_t output_len = 0, error_len = 0, lease_aid_len = 0, lease_reason_len = 0;
    std::shared_ptr<const Response> handoff;  // for waiters, when there are any

    bool is(std::string_view aid, std::string_view key) const noexcept;
    /// Keeps `r`; `n`: the bytes its parts and the entry's aid and key take in `data`.
    void keep_result(const Response& r, std::size_t n);
    void copy_result_to(Response& r) const;
    /// What the entry counts in stored_bytes_ while it keeps a result whose parts take
    /// `result` bytes (see result_bytes).
    std::size_t bytes_with(std::size_t result) const noexcept { return sizeof(Entry) + aid_len + key_len + result; }
    static std::size_t result_bytes(const Response& r) noexcept {
      return r.output_json.size() + r.error.size() + r.lease_aid.size() + r.lease_reason.size();
    }
    /// What a kept entry counts in stored_bytes_.
    std::size_t kept_bytes() const noexcept {
      return bytes_with(output_len + error_len + lease_aid_len + lease_reason_len);
    }
  };
  /// The index: hash chains whose links sit in an array of their own, beside the entries,
  /// so that a lookup that finds nothing touches no entry.
  struct Link {
    std::uint32_t tag = 0;       // the key hash's low 32 bits (its bucket: tag & (buckets - 1))
    std::uint32_t next = kNone;  // the next entry in the same bucket
  };
  std::uint64_t hash_of(std::string_view aid, std::string_view key) const noexcept;
  std::uint32_t find(std::string_view aid, std::string_view key, std::uint32_t tag) const;
  void link_bucket(std::uint32_t slot, std::uint32_t tag);
  void unlink_bucket(std::uint32_t slot);
  void rehash(std::size_t buckets);
  std::uint32_t take_slot();
  void append_kept(std::uint32_t slot);
  void release(std::uint32_t slot);  // takes a running entry off the index and retires it
  void free_slot(std::uint32_t slot);
  std::uint32_t unindex_oldest();   // takes the oldest kept entry off the queue and the index (kNone: none)
  void retire(std::uint32_t slot);  // an entry taken off the index: freed once no waiter needs it
  bool evict_oldest();              // false if no kept entry can go
  std::uint32_t reuse_oldest();     // evicts the oldest kept entry for a new key: the new key's slot (kNone: none)
  void prune(std::int64_t now_ms);
  /// Keeps `response` in `e` if its `bytes` fit the budget (evicting the oldest for room).
  bool keep_result(Entry& e, const Response& response, std::size_t bytes);
  // (these three out of a fresh key's path: see begin())
  [[gnu::noinline]] Ticket found(std::uint32_t slot, const Fingerprint& fp, Response& hit);
  [[gnu::noinline]] void make_room_for_key(std::uint32_t slot, std::size_t n);
  [[gnu::noinline]] void hand_off(Entry& e, const Response& response);

  Options options_;
  mutable LightMutex mu_;
  std::condition_variable_any done_;               // a call that had waiters completed
  std::vector<Entry> entries_;                     // the slab (grows to max_entries)
  std::vector<Link> links_;                        // one per entry
  std::vector<std::uint32_t> buckets_;             // heads of the chains: a power of two, at least buckets_for(entries)
  std::uint32_t free_ = kNone;                     // free entries, chained through `next`
  std::uint32_t oldest_ = kNone, newest_ = kNone;  // kept entries, in expiry order
  std::size_t in_use_ = 0;                         // running + kept
  std::size_t stored_bytes_ = 0;
  std::uint64_t seed_ = 0;  // of the key hash
};

}  // namespace machina
