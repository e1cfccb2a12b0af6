// The idempotency store shared by a group of NATS hosts (`--nats-idempotency kv`): a JetStream
// key-value bucket in which the first host to take a key claims it (create: fails if the key
// is there), runs the call and leaves its answer; a duplicate on any host of the group gets
// that answer, waits while the claim runs, and once the claim's end has passed without an
// answer (its host died) is told that the outcome is unknown (`tool_crashed`), never running
// the tool again under the key. Every entry is signed (HMAC-SHA256) with a key the group's
// hosts share and their clients do not have; an entry that fails its check is neither
// replayed nor run over (`internal_error`, one line on stderr, counted). The entry format is
// in docs/nats.md (the shared store).
#pragma once

#include <machina/idempotency_store.hpp>

#include <nats/nats.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace machina::cli {

/// The shortest key the shared store is signed with (--kv-key-file).
inline constexpr std::size_t kKvKeyMinBytes = 32;

/// The key of the file at `path` (trailing CR and LF removed). Throws ConfigError naming the
/// file if it cannot be read, or if the key is shorter than kKvKeyMinBytes.
std::string load_kv_key(const std::string& path);

struct NatsKvStoreOptions {
  std::string bucket = "machina_idempotency";
  std::string key;                     // the group's key (load_kv_key)
  std::int64_t ttl_s = 600;            // how long an entry lasts (the bucket's maximum age)
  std::int64_t claim_grace_ms = 5000;  // a claim outlives its call's deadline by this much
};

class NatsKvStore final : public IdempotencyStore {
 public:
  /// Binds to the bucket on `nc` (connected; it outlives the store), making it if it is not
  /// there. `host_id` names this host in its claims; `say` writes one line on stderr.
  /// Throws ConfigError.
  NatsKvStore(natsConnection* nc, NatsKvStoreOptions options, std::string host_id,
              std::function<void(const std::string&)> say);
  ~NatsKvStore() override;
  NatsKvStore(const NatsKvStore&) = delete;
  NatsKvStore& operator=(const NatsKvStore&) = delete;

  Ticket begin(const KeyedCall& call, Response& answer) override;
  Ticket wait(const Ticket& ticket, Response& answer) override;
  void complete(const Ticket& ticket, const Response& response, bool keep, std::int64_t now_ms) noexcept override;

  /// Entries found failing their check, since the start.
  std::uint64_t entries_rejected() const { return rejected_.load(std::memory_order_relaxed); }
  /// The largest value an entry may have (a larger answer is stored as output_too_large).
  std::size_t max_value_bytes() const { return max_value_bytes_; }

 private:
  /// A call between begin() and its end: the claim it holds (run) or waits on (wait).
  struct Pending {
    std::string store_key;    // "k" + the hex SHA-256 of the aid and key
    std::string fingerprint;  // keyed hash of the aid and input
    std::string key_excerpt;  // the idempotency key, for messages
    std::int64_t timeout_ms = 0;
    std::int64_t until_ms = 0;   // wait: the end of the claim waited on (Unix time)
    std::uint64_t revision = 0;  // run: the claim's
  };
  /// What a read found under a key.
  struct Read {
    enum class What { none, running, done, forged, failed } what = What::none;
    std::string fingerprint;
    std::int64_t until_ms = 0;
    std::string response;  // done: the stored response object's JSON
    std::string failure;   // failed: why
  };
  std::string mac(std::string_view purpose, std::string_view a, std::string_view b) const;
  std::string seal(const std::string& store_key, const std::string& body) const;
  Read read(const std::string& store_key);
  /// Tries to claim `p`'s key for `p`'s call: true if this call holds it now.
  bool claim(Pending& p);
  /// `answer` from a read that found the key held (not by a claim of this call).
  Ticket settle(std::uint32_t slot, const Read& r, Response& answer);
  Ticket answered(std::uint32_t slot, Response& answer, Response given);
  std::uint32_t add_pending(Pending p);
  Pending take_pending(std::uint32_t slot);
  Response forged(const std::string& store_key);

  NatsKvStoreOptions o_;
  std::string host_id_;
  std::function<void(const std::string&)> say_;
  std::string signing_key_;  // derived from the group's key for this store alone
  jsCtx* js_ = nullptr;
  kvStore* kv_ = nullptr;
  std::size_t max_value_bytes_ = 0;
  std::atomic<std::uint64_t> rejected_{0};
  std::mutex mu_;
  std::vector<Pending> pending_;
  std::vector<std::uint32_t> free_;
};

}  // namespace machina::cli
