// See idempotency_cache.hpp.
#include <machina/idempotency_cache.hpp>

#include <nettle/sha2.h>

#include <cstring>

namespace machina {

IdempotencyCache::Fingerprint IdempotencyCache::fingerprint(std::string_view input_json) {
  Fingerprint fp{};
  if (input_json.size() < fp.size()) {
    fp[0] = static_cast<unsigned char>(input_json.size());
    std::memcpy(fp.data() + 1, input_json.data(), input_json.size());
    return fp;
  }
  static_assert(std::tuple_size_v<Fingerprint> == 1 + SHA256_DIGEST_SIZE);
  sha256_ctx ctx;
  sha256_init(&ctx);
  sha256_update(&ctx, input_json.size(), reinterpret_cast<const std::uint8_t*>(input_json.data()));
  fp[0] = 0xFF;
  sha256_digest(&ctx, SHA256_DIGEST_SIZE, fp.data() + 1);
  return fp;
}

std::string IdempotencyCache::scope(std::string_view aid, std::string_view key) {
  std::string s;
  s.reserve(aid.size() + key.size() + 1);
  s.append(aid).push_back('\0');  // aids never contain NUL, so scopes cannot collide
  s.append(key);
  return s;
}

void IdempotencyCache::erase(List::iterator it) {
  index_.erase(it->scoped_key);
  order_.erase(it);
}

void IdempotencyCache::prune(std::int64_t now_ms) {
  while (!order_.empty()) {
    const Entry& front = order_.front();
    if (front.flight || front.expires_at > now_ms) break;
    erase(order_.begin());
  }
}

IdempotencyCache::Ticket IdempotencyCache::begin(std::string_view aid, std::string_view key,
                                                 const Fingerprint& fp, std::int64_t now_ms) {
  const std::string scoped = scope(aid, key);
  std::lock_guard lock(mu_);
  prune(now_ms);
  if (auto found = index_.find(scoped); found != index_.end()) {
    Entry& e = *found->second;
    if (!e.flight && e.expires_at <= now_ms) {
      erase(found->second);
    } else if (e.fp != fp) {
      return {Outcome::conflict, {}, nullptr};
    } else if (e.flight) {
      return {Outcome::wait, {}, e.flight};
    } else {
      return {Outcome::hit, *e.response, nullptr};
    }
  }
  while (order_.size() >= options_.max_entries && !order_.empty()) erase(order_.begin());
  auto flight = std::make_shared<Flight>();
  order_.push_back(Entry{scoped, fp, flight, {}, 0});
  auto it = std::prev(order_.end());
  index_.emplace(it->scoped_key, it);
  return {Outcome::run, {}, flight};
}

Response IdempotencyCache::wait(const std::shared_ptr<Flight>& flight) {
  std::unique_lock lock(flight->mu);
  flight->cv.wait(lock, [&] { return flight->done; });
  return *flight->response;
}

void IdempotencyCache::complete(std::string_view aid, std::string_view key,
                                const std::shared_ptr<Flight>& flight, const Response& response,
                                bool keep, std::int64_t now_ms) {
  auto shared = std::make_shared<const Response>(response);  // one copy, for waiters and hits
  {
    std::lock_guard lock(flight->mu);
    flight->response = shared;
    flight->done = true;
  }
  flight->cv.notify_all();

  const std::string scoped = scope(aid, key);
  std::lock_guard lock(mu_);
  auto found = index_.find(scoped);
  // The entry may have been evicted at capacity, or replaced after that.
  if (found == index_.end() || found->second->flight != flight) return;
  if (!keep) {
    erase(found->second);
    return;
  }
  Entry& e = *found->second;
  e.flight.reset();
  e.response = std::move(shared);
  e.expires_at = now_ms + options_.ttl_ms;
  order_.splice(order_.end(), order_, found->second);  // O(1): completed entries stay in expiry order
}

std::size_t IdempotencyCache::size() const {
  std::lock_guard lock(mu_);
  return order_.size();
}

}  // namespace machina
