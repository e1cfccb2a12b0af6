// See idempotency_cache.hpp.
#include <machina/errors.hpp>
#include <machina/idempotency_cache.hpp>

#include <nettle/sha2.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <random>

namespace machina {

namespace {
// A freed entry keeps its buffer for the next key, unless it is large: memory held by
// entries no longer kept stays small, whatever they once held.
constexpr std::size_t kKeepCapacity = 4096;

// (memcmp must not be given a null pointer, which an empty view may hold)
bool same_bytes(const char* at, std::string_view v) noexcept {
  return v.empty() || std::memcmp(at, v.data(), v.size()) == 0;
}
// A key, an aid, an input and an output are copied on every fresh key, most of them short:
// up to 32 bytes are copied inline, as two overlapping words, rather than through the C
// library, whose choice of method by size is one more branch for the processor to guess per
// copy.
inline void copy_bytes(char* to, std::string_view v) noexcept {
  const std::size_t n = v.size();
  const char* from = v.data();
  if (n >= 8 && n <= 16) {
    std::uint64_t head, tail;
    std::memcpy(&head, from, 8);
    std::memcpy(&tail, from + n - 8, 8);
    std::memcpy(to, &head, 8);
    std::memcpy(to + n - 8, &tail, 8);
  } else if (n > 16 && n <= 32) {
    unsigned char head[16], tail[16];
    std::memcpy(head, from, 16);
    std::memcpy(tail, from + n - 16, 16);
    std::memcpy(to, head, 16);
    std::memcpy(to + n - 16, tail, 16);
  } else if (n != 0) {
    std::memcpy(to, from, n);
  }
}

}  // namespace

void IdempotencyCache::Buffer::reserve(std::size_t n, std::size_t keep) {
  if (n <= capacity) return;
  const std::size_t grown = std::max(n, capacity + capacity / 2);
  auto more = std::make_unique_for_overwrite<char[]>(grown);
  if (keep > 0) std::memcpy(more.get(), bytes.get(), keep);
  bytes = std::move(more);
  capacity = grown;
}

bool IdempotencyCache::Entry::is(std::string_view aid, std::string_view key) const noexcept {
  return aid_len == aid.size() && key_len == key.size() && same_bytes(data.bytes.get(), aid) &&
         same_bytes(data.bytes.get() + aid_len, key);
}

void IdempotencyCache::Entry::keep_result(const Response& r, std::size_t n) {
  const std::size_t scope = aid_len + key_len;
  if (n > data.capacity) [[unlikely]]
    data.reserve(n, scope);
  kind = r.kind;
  lease_tier = r.lease_tier;
  output_len = r.output_json.size();
  error_len = r.error.size();
  lease_aid_len = r.lease_aid.size();
  lease_reason_len = r.lease_reason.size();
  char* p = data.bytes.get() + scope;
  copy_bytes(p, r.output_json);
  p += output_len;
  if (error_len + lease_aid_len + lease_reason_len > 0) [[unlikely]] {  // (an error's text, a lease's details)
    copy_bytes(p, r.error);
    copy_bytes(p + error_len, r.lease_aid);
    copy_bytes(p + error_len + lease_aid_len, r.lease_reason);
  }
}

void IdempotencyCache::Entry::copy_result_to(Response& r) const {
  r.kind = kind;
  r.lease_tier = lease_tier;
  const char* p = data.bytes.get() + aid_len + key_len;
  for (auto [part, n] : {std::pair{&r.output_json, output_len},
                         {&r.error, error_len},
                         {&r.lease_aid, lease_aid_len},
                         {&r.lease_reason, lease_reason_len}}) {
    part->assign(p, n);
    p += n;
  }
}

IdempotencyCache::IdempotencyCache(Options options) : options_(options) {
  if (options_.max_entries < 1 || options_.max_entries > UINT32_MAX / 2) {
    throw ConfigError("the idempotency cache needs from 1 to 2147483647 entries");
  }
  if (options_.ttl_ms < 1) throw ConfigError("the idempotency ttl must be at least 1 ms");
  if (options_.max_key_bytes < 1) throw ConfigError("idempotency keys must be allowed at least 1 byte");
  if (options_.max_stored_bytes < 1) throw ConfigError("the idempotency cache must be allowed at least 1 byte");
  rehash(128);
  std::random_device entropy;
  seed_ = (std::uint64_t{entropy()} << 32) | entropy();
}

IdempotencyCache::Fingerprint IdempotencyCache::fingerprint(std::string_view input_json) {
  if (is_hashed(input_json)) return digest(input_json);
  Fingerprint fp;
  write_short(fp, input_json);
  return fp;
}

void IdempotencyCache::write_short(Fingerprint& fp, std::string_view input_json) noexcept {
  fp[0] = static_cast<unsigned char>(input_json.size());
  copy_bytes(reinterpret_cast<char*>(fp.data()) + 1, input_json);
  std::memset(fp.data() + 1 + input_json.size(), 0, fp.size() - 1 - input_json.size());
}

IdempotencyCache::Fingerprint IdempotencyCache::digest(std::string_view input_json) {
  static_assert(std::tuple_size_v<Fingerprint> == 1 + SHA256_DIGEST_SIZE);
  Fingerprint fp{};
  sha256_ctx ctx;
  sha256_init(&ctx);
  sha256_update(&ctx, input_json.size(), reinterpret_cast<const std::uint8_t*>(input_json.data()));
  fp[0] = 0xFF;
  sha256_digest(&ctx, SHA256_DIGEST_SIZE, fp.data() + 1);
  return fp;
}

std::uint64_t IdempotencyCache::hash_of(std::string_view aid, std::string_view key) const noexcept {
  // The key alone, seeded by the aid's length: the same key for two tools whose aids have
  // the same length shares a chain (find() compares both), and the aid need not be hashed
  // on every call. The seed is drawn anew for each cache, so that keys which share a
  // bucket cannot be precomputed.
  return XXH3_64bits_withSeed(key.data(), key.size(), seed_ + aid.size());
}

std::uint32_t IdempotencyCache::find(std::string_view aid, std::string_view key, std::uint32_t tag) const {
  for (std::uint32_t s = buckets_[tag & (buckets_.size() - 1)]; s != kNone; s = links_[s].next) {
    if (links_[s].tag == tag && entries_[s].is(aid, key)) return s;
  }
  return kNone;
}

void IdempotencyCache::link_bucket(std::uint32_t slot, std::uint32_t tag) {
  std::uint32_t& head = buckets_[tag & (buckets_.size() - 1)];
  links_[slot] = Link{tag, head};
  head = slot;
}

void IdempotencyCache::unlink_bucket(std::uint32_t slot) {
  std::uint32_t* at = &buckets_[links_[slot].tag & (buckets_.size() - 1)];
  while (*at != slot) at = &links_[*at].next;
  *at = links_[slot].next;
}

void IdempotencyCache::rehash(std::size_t buckets) {
  buckets_.assign(buckets, kNone);
  for (std::uint32_t s = 0; s < entries_.size(); ++s) {
    if (entries_[s].state == State::running || entries_[s].state == State::done) link_bucket(s, links_[s].tag);
  }
}

void IdempotencyCache::append_kept(std::uint32_t slot) {
  entries_[slot].next = kNone;
  if (newest_ != kNone)
    entries_[newest_].next = slot;
  else
    oldest_ = slot;
  newest_ = slot;
}

std::uint32_t IdempotencyCache::take_slot() {
  if (free_ != kNone) {
    const std::uint32_t slot = free_;
    free_ = entries_[slot].next;
    entries_[slot].next = kNone;
    return slot;
  }
  // The index grows first: if that fails, nothing has changed (the new slot would be on
  // no list, lost for good, if the slab grew first).
  if (buckets_for(entries_.size() + 1) > buckets_.size()) rehash(buckets_.size() * 2);
  links_.emplace_back();
  try {
    entries_.emplace_back();
  } catch (...) {
    links_.pop_back();  // (the two grow together or not at all)
    throw;
  }
  return static_cast<std::uint32_t>(entries_.size() - 1);
}

void IdempotencyCache::free_slot(std::uint32_t slot) {
  Entry& e = entries_[slot];
  e.state = State::free;
  if (e.handoff) [[unlikely]]
    e.handoff.reset();
  if (e.data.capacity > kKeepCapacity) [[unlikely]]
    e.data = Buffer{};
  e.next = free_;
  free_ = slot;
}

void IdempotencyCache::retire(std::uint32_t slot) {
  if (entries_[slot].waiters > 0)
    entries_[slot].state = State::handed_off;  // the last waiter frees it
  else
    free_slot(slot);
}

void IdempotencyCache::release(std::uint32_t slot) {
  unlink_bucket(slot);
  --in_use_;
  retire(slot);
}

std::uint32_t IdempotencyCache::unindex_oldest() {
  if (oldest_ == kNone) return kNone;
  const std::uint32_t slot = oldest_;
  Entry& e = entries_[slot];
  oldest_ = e.next;
  if (oldest_ == kNone) newest_ = kNone;
  stored_bytes_ -= e.kept_bytes();
  unlink_bucket(slot);
  --in_use_;
  return slot;
}

bool IdempotencyCache::evict_oldest() {
  const std::uint32_t slot = unindex_oldest();
  if (slot == kNone) return false;
  retire(slot);
  return true;
}

std::uint32_t IdempotencyCache::reuse_oldest() {
  // The new key takes the evicted entry as it is (not freed and taken again), unless a
  // waiter has yet to collect its answer or its buffer is one a freed entry gives back.
  const std::uint32_t slot = unindex_oldest();
  if (slot == kNone) return kNone;
  Entry& e = entries_[slot];
  if (e.waiters == 0 && e.data.capacity <= kKeepCapacity) [[likely]] {
    e.next = kNone;
    return slot;
  }
  retire(slot);
  return take_slot();
}

void IdempotencyCache::prune(std::int64_t now_ms) {
  while (oldest_ != kNone && entries_[oldest_].expires_at <= now_ms) evict_oldest();
}

// The path of a call with a fresh key is kept short in code as well as in work: the
// instruction cache and branch predictors hold a call's whole --serve path and not much
// more, so every line of code on it counts,
// so what a fresh key rarely needs (a found entry, waiters, out of memory) is out of line,
// and a full cache of running calls and expiry are off its straight path.

IdempotencyCache::Ticket IdempotencyCache::begin(std::string_view aid, std::string_view key,
                                                 std::string_view input_json, std::int64_t now_ms, Response& hit) {
  const auto tag = static_cast<std::uint32_t>(hash_of(aid, key));
  // A short input's fingerprint is written straight into the entry it binds: built on the
  // stack and copied at once, its bytes were read back before the processor could forward
  // them (stores of other sizes), a wait on every call.
  const bool hashed = is_hashed(input_json);
  Fingerprint long_fp;  // (set if hashed)
  if (hashed) [[unlikely]]
    long_fp = digest(input_json);
  std::lock_guard lock(mu_);
  // (kept entries are in expiry order: once the expired are gone, whatever is found is not)
  if (oldest_ != kNone && entries_[oldest_].expires_at <= now_ms) [[unlikely]]
    prune(now_ms);
  if (const std::uint32_t slot = find(aid, key, tag); slot != kNone) [[unlikely]] {
    return found(slot, hashed ? long_fp : fingerprint(input_json), hit);
  }
  std::uint32_t slot;
  if (in_use_ < options_.max_entries) {
    slot = take_slot();
  } else {
    slot = reuse_oldest();
    if (slot == kNone) [[unlikely]]
      return Ticket{Outcome::full};
  }
  Entry& e = entries_[slot];
  if (aid.size() + key.size() > e.data.capacity) [[unlikely]]
    make_room_for_key(slot, aid.size() + key.size());
  copy_bytes(e.data.bytes.get(), aid);
  copy_bytes(e.data.bytes.get() + aid.size(), key);
  e.aid_len = aid.size();
  e.key_len = key.size();
  if (hashed) [[unlikely]]
    e.fp = long_fp;
  else
    write_short(e.fp, input_json);
  e.state = State::running;
  e.waiters = 0;
  link_bucket(slot, tag);
  ++in_use_;
  return Ticket{Outcome::run, slot};
}

IdempotencyCache::Ticket IdempotencyCache::found(std::uint32_t slot, const Fingerprint& fp, Response& hit) {
  Entry& e = entries_[slot];
  if (e.fp != fp) return Ticket{Outcome::conflict};
  if (e.state == State::running) {
    ++e.waiters;
    return Ticket{Outcome::wait, slot};
  }
  e.copy_result_to(hit);
  return Ticket{Outcome::hit};
}

void IdempotencyCache::make_room_for_key(std::uint32_t slot, std::size_t n) {
  try {
    entries_[slot].data.reserve(n, 0);
  } catch (...) {
    free_slot(slot);  // (taken, not yet indexed)
    throw;
  }
}

Response IdempotencyCache::wait(const Ticket& ticket) {
  std::shared_ptr<const Response> answer;
  {
    std::unique_lock lock(mu_);
    // The entry keeps its slot while it has waiters: no other key can take it meanwhile.
    done_.wait(lock, [&] { return entries_[ticket.slot].state != State::running; });
    Entry& e = entries_[ticket.slot];
    answer = e.handoff;
    if (--e.waiters == 0) {
      e.handoff.reset();
      if (e.state == State::handed_off) free_slot(ticket.slot);
    }
  }
  // (copied outside the lock; none if it could not be handed over: out of memory)
  if (!answer) return Response::failure(ErrorKind::internal_error, "internal error: the first call's answer was lost");
  return *answer;
}

void IdempotencyCache::complete(const Ticket& ticket, const Response& response, bool keep,
                                std::int64_t now_ms) noexcept {
  bool notify = false;
  {
    std::lock_guard lock(mu_);
    Entry& e = entries_[ticket.slot];  // a running entry is never evicted: still this call's
    if (e.waiters > 0) [[unlikely]] {
      hand_off(e, response);
      notify = true;
    }
    const std::size_t bytes = e.bytes_with(Entry::result_bytes(response));
    if (keep && keep_result(e, response, bytes)) {
      e.state = State::done;
      e.expires_at = now_ms + options_.ttl_ms;
      stored_bytes_ += bytes;  // (e.kept_bytes() from now on)
      append_kept(ticket.slot);
    } else {
      release(ticket.slot);
    }
  }
  if (notify) done_.notify_all();
}

void IdempotencyCache::hand_off(Entry& e, const Response& response) {
  // Out of memory here must not leave the entry running (its waiters would wait for
  // good): they get an internal error instead.
  try {
    e.handoff = std::make_shared<const Response>(response);
  } catch (const std::bad_alloc&) {
    e.handoff.reset();
  }
}

bool IdempotencyCache::keep_result(Entry& e, const Response& response, std::size_t bytes) {
  if (bytes > options_.max_stored_bytes) [[unlikely]]
    return false;
  while (stored_bytes_ + bytes > options_.max_stored_bytes && evict_oldest()) {
  }
  try {
    e.keep_result(response, bytes - sizeof(Entry));
    return true;
  } catch (const std::bad_alloc&) {
    return false;  // (answered, not kept)
  }
}

std::size_t IdempotencyCache::size() const {
  std::lock_guard lock(mu_);
  return in_use_;
}

std::size_t IdempotencyCache::longest_chain() const {
  std::lock_guard lock(mu_);
  std::size_t longest = 0;
  for (std::uint32_t head : buckets_) {
    std::size_t n = 0;
    for (std::uint32_t s = head; s != kNone; s = links_[s].next) ++n;
    longest = std::max(longest, n);
  }
  return longest;
}

std::size_t IdempotencyCache::stored_bytes() const {
  std::lock_guard lock(mu_);
  return stored_bytes_;
}

}  // namespace machina
