// Idempotency: results kept per (aid, key), bound to a fingerprint of the input,
// single-flight for duplicates in flight, bounded in size and time with O(1) eviction.
#pragma once

#include <machina/request.hpp>

#include <array>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

namespace machina {

class IdempotencyCache {
 public:
  struct Options {
    std::size_t max_entries = 1024;  // seed: IDEMP_MAX_ENTRIES
    std::int64_t ttl_ms = 60'000;    // seed: IDEMP_DEFAULT_TTL_MS
  };
  /// What binds a key to its input: the input itself when it is at most 32 bytes (byte 0
  /// holds its length), else 0xFF and the input's SHA-256. Exact either way, short inputs
  /// without hashing.
  using Fingerprint = std::array<unsigned char, 33>;

  /// Shared by the call that runs the tool and the duplicates waiting for it.
  struct Flight {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::shared_ptr<const Response> response;
  };

  enum class Outcome {
    run,       // first with this key: run the tool, then complete()
    hit,       // a stored result with the same input: `response`
    wait,      // the same call is running: wait(flight)
    conflict   // the key was used with another input
  };
  struct Ticket {
    Outcome outcome;
    Response response;
    std::shared_ptr<Flight> flight;
  };

  explicit IdempotencyCache(Options options) : options_(options) {}

  static Fingerprint fingerprint(std::string_view input_json);

  Ticket begin(std::string_view aid, std::string_view key, const Fingerprint& fp, std::int64_t now_ms);
  static Response wait(const std::shared_ptr<Flight>& flight);
  /// Publishes the owner's response to waiters; keeps it for later hits if `keep`.
  void complete(std::string_view aid, std::string_view key, const std::shared_ptr<Flight>& flight,
                const Response& response, bool keep, std::int64_t now_ms);

  std::size_t size() const;
  const Options& options() const { return options_; }

 private:
  struct Entry {
    std::string scoped_key;
    Fingerprint fp;
    std::shared_ptr<Flight> flight;  // set while running
    std::shared_ptr<const Response> response;  // set once flight is null (shared with it)
    std::int64_t expires_at = 0;     // 0 while running
  };
  using List = std::list<Entry>;

  static std::string scope(std::string_view aid, std::string_view key);
  void prune(std::int64_t now_ms);
  void erase(List::iterator it);

  Options options_;
  mutable std::mutex mu_;
  List order_;  // completed entries in expiry order after the running ones they passed
  std::unordered_map<std::string_view, List::iterator> index_;  // views into Entry::scoped_key
};

}  // namespace machina
