// Leases: single-use, time-limited permissions for one tool, minted by an operator
// who holds the secret and verified by the host. The request stream can present a
// lease but never create or extend one.
//
// Token: "mlt1.<hex aid>.<expiry, unix ms>.<32 hex nonce>.<64 hex HMAC-SHA256>", the
// MAC over everything before the last dot.
//
// Ledger (single use across processes): a folder per window of expiry times ("b<window>"),
// one file per used lease in it ("<nonce>", made with O_EXCL). A leased call makes one
// file; a process sweeps at most once per window, listing only the window folders (as many
// as max_ttl / window) and removing those that ended a window ago: the cost of a call does
// not grow with the number of leases in use.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>

namespace machina {

/// Where the secret comes from: MACHINA_LEASE_SECRET (as it is now, or as it was when
/// protect_lease_secret(true) took it out of the environment), else the file named by
/// MACHINA_LEASE_KEY_FILE. Protects the variable as protect_lease_secret(false) does.
/// Throws ConfigError if neither is set, the file cannot be read, or the secret is shorter
/// than 16 bytes.
std::string load_lease_secret();

/// Takes MACHINA_LEASE_SECRET out of reach before any tool runs: its value is kept for
/// load_lease_secret and wiped from the environment block the process started with (what
/// /proc/<pid>/environ shows to any process of the user, and what unsetenv alone leaves
/// as it was). With `unset` (machina-toolhost itself) the variable is removed from the
/// environment too; without (a program embedding the host, whose environment is its own)
/// it stays, as a copy, for the program and its children. Does nothing if it is not set.
/// Call it early, before other threads read the environment.
void protect_lease_secret(bool unset);

/// A lease lifetime given in seconds, as milliseconds. Throws ConfigError unless it is a
/// finite number from 0.001 s to `max_ttl_ms`.
std::int64_t lease_ttl_ms(double seconds, std::int64_t max_ttl_ms);

class LeaseAuthority {
 public:
  struct Options {
    std::size_t max_consumed = 65'536;           // bound on remembered (used, unexpired) leases
    std::int64_t max_ttl_ms = 24 * 3'600'000LL;  // longest lease that may be issued
    std::string ledger_dir;                      // if set: consumed leases are also recorded
                                                 // here, so single use holds across processes
    std::int64_t ledger_bucket_ms = 1'000;       // the ledger files leases by expiry, this long each
  };

  LeaseAuthority(std::string secret, Options options);

  /// Mints a token for `aid` valid for `ttl_ms`. Throws ConfigError on a bad ttl or aid.
  std::string issue(std::string_view aid, std::int64_t ttl_ms, std::int64_t now_ms) const;
  const Options& options() const { return options_; }

  /// Checks and consumes a token for `aid`. Returns the rejection reason (malformed,
  /// bad_signature, wrong_tool, expired, consumed, replay_cache_full, ledger_unavailable),
  /// or nullopt if the lease is good (it is then used up).
  std::optional<std::string> redeem(std::string_view token, std::string_view aid, std::int64_t now_ms);

 private:
  std::string mac_hex(std::string_view payload) const;
  bool consume(const std::string& nonce, std::int64_t expires_at, std::int64_t now_ms);
  std::optional<std::string> consume_in_ledger(const std::string& nonce, std::int64_t expires_at, std::int64_t now_ms);

  void sweep_ledger(std::int64_t now_ms);

  std::string secret_;
  Options options_;
  std::mutex mu_;
  std::unordered_set<std::string> consumed_;
  std::multimap<std::int64_t, std::string> by_expiry_;
  std::int64_t swept_bucket_ = -1;  // the bucket of the last sweep of the ledger (one per bucket)
};

}  // namespace machina
