// See nats_kv_store.hpp; the entry format is in docs/nats.md (the shared store).
#include "nats_kv_store.hpp"

#include <machina/clock.hpp>
#include <machina/errors.hpp>
#include <machina/sha256_hex.hpp>

#include <nettle/hmac.h>
#include <nettle/memops.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <sstream>
#include <thread>

namespace machina::cli {
namespace {

using json = nlohmann::json;

constexpr char kPurpose[] = "machina-toolhost shared idempotency store v1";
constexpr int kClaimAttempts = 50;               // claims lost to another host in a row before giving up
constexpr std::int64_t kPollMs = 20;             // how often a duplicate looks whether the claim it waits on ended
constexpr std::int64_t kMaxBytes = 256ll << 20;  // the bucket's bytes, in all
constexpr std::size_t kHeaderRoom = 4096;        // of the server's largest message, kept for the headers

std::string hmac_sha256(std::string_view key, std::initializer_list<std::string_view> parts) {
  hmac_sha256_ctx ctx;
  hmac_sha256_set_key(&ctx, key.size(), reinterpret_cast<const std::uint8_t*>(key.data()));
  for (std::string_view part : parts)
    hmac_sha256_update(&ctx, part.size(), reinterpret_cast<const std::uint8_t*>(part.data()));
  std::uint8_t digest[SHA256_DIGEST_SIZE];
  hmac_sha256_digest(&ctx, sizeof digest, digest);
  return std::string(reinterpret_cast<const char*>(digest), sizeof digest);
}

std::string nats_error(natsStatus s) {
  const char* last = nats_GetLastError(nullptr);
  return std::string(natsStatus_GetText(s)) + (last != nullptr && *last != '\0' ? std::string(" (") + last + ")" : "");
}

std::string excerpt_of(std::string_view key) {
  return key.size() <= 64 ? std::string(key) : std::string(key.substr(0, 64)) + "…";
}

ErrorKind kind_of(const std::string& code) {
  if (code == "ok") return ErrorKind::none;
  for (const auto& k : all_error_kinds()) {
    if (k.code == code) return k.kind;
  }
  return ErrorKind::internal_error;
}

json stored_response(const Response& r) {
  json out = {{"code", r.ok() ? std::string_view("ok") : error_info(r.kind).code}};
  if (!r.output_json.empty()) out["output_json"] = r.output_json;
  if (!r.error.empty()) out["error"] = r.error;
  return out;
}

}  // namespace

std::string load_kv_key(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("--kv-key-file " + path + ": cannot be read");
  std::string key((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw ConfigError("--kv-key-file " + path + ": cannot be read");
  while (!key.empty() && (key.back() == '\n' || key.back() == '\r')) key.pop_back();
  if (key.size() < kKvKeyMinBytes) {
    throw ConfigError("--kv-key-file " + path + ": the key must be at least " + std::to_string(kKvKeyMinBytes) +
                      " bytes long (it has " + std::to_string(key.size()) + ")");
  }
  return key;
}

NatsKvStore::NatsKvStore(natsConnection* nc, NatsKvStoreOptions options, std::string host_id,
                         std::function<void(const std::string&)> say)
    : o_(std::move(options)), host_id_(std::move(host_id)), say_(std::move(say)) {
  if (o_.key.size() < kKvKeyMinBytes)
    throw ConfigError("the shared idempotency store needs a key of at least 32 bytes");
  if (o_.ttl_s < 1) throw ConfigError("--nats-kv-ttl-s must be at least 1");
  if (o_.claim_grace_ms < 0) throw ConfigError("--nats-claim-grace-ms must not be negative");
  signing_key_ = hmac_sha256(o_.key, {kPurpose});
  const std::int64_t max_payload = natsConnection_GetMaxPayload(nc);
  max_value_bytes_ = max_payload > static_cast<std::int64_t>(2 * kHeaderRoom)
                         ? static_cast<std::size_t>(max_payload) - kHeaderRoom
                         : static_cast<std::size_t>(max_payload) / 2;
  natsStatus s = natsConnection_JetStream(&js_, nc, nullptr);
  if (s == NATS_OK) s = js_KeyValue(&kv_, js_, o_.bucket.c_str());
  if (s == NATS_NOT_FOUND || (s != NATS_OK && js_ != nullptr)) {
    // Not there yet: the first host of the group makes it.
    kvConfig cfg;
    kvConfig_Init(&cfg);
    cfg.Bucket = o_.bucket.c_str();
    cfg.Description = "machina-toolhost idempotency claims and answers";
    cfg.History = 1;
    cfg.TTL = o_.ttl_s * 1'000'000'000;  // (nanoseconds)
    cfg.MaxBytes = kMaxBytes;
    cfg.MaxValueSize = static_cast<std::int32_t>(max_value_bytes_);
    cfg.StorageType = js_FileStorage;
    s = js_CreateKeyValue(&kv_, js_, &cfg);
  }
  if (s != NATS_OK) {
    const std::string why = nats_error(s);
    if (js_ != nullptr) jsCtx_Destroy(js_);
    throw ConfigError("--nats-idempotency kv: cannot open or make the key-value bucket " + o_.bucket + ": " + why);
  }
}

NatsKvStore::~NatsKvStore() {
  kvStore_Destroy(kv_);
  jsCtx_Destroy(js_);
}

std::string NatsKvStore::mac(std::string_view purpose, std::string_view a, std::string_view b) const {
  const std::string digest =
      hmac_sha256(signing_key_, {purpose, std::string_view("\0", 1), a, std::string_view("\0", 1), b});
  return hex_of(reinterpret_cast<const std::uint8_t*>(digest.data()), digest.size());
}

std::string NatsKvStore::seal(const std::string& store_key, const std::string& body) const {
  return mac("entry", store_key, body) + " " + body;
}

NatsKvStore::Read NatsKvStore::read(const std::string& store_key) {
  Read r;
  kvEntry* e = nullptr;
  const natsStatus s = kvStore_Get(&e, kv_, store_key.c_str());
  if (s == NATS_NOT_FOUND) return r;
  if (s != NATS_OK) {
    r.what = Read::What::failed;
    r.failure = nats_error(s);
    return r;
  }
  const std::string_view value(static_cast<const char*>(kvEntry_Value(e)),
                               static_cast<std::size_t>(kvEntry_ValueLen(e)));
  r.what = Read::What::forged;
  const auto space = value.find(' ');
  if (space != std::string_view::npos) {
    const std::string_view body = value.substr(space + 1);
    const std::string expected = mac("entry", store_key, body);
    if (space == expected.size() && memeql_sec(expected.data(), value.data(), expected.size())) {  // constant time
      const json entry = json::parse(body, nullptr, false);
      if (entry.is_object() && entry.contains("fp") && entry["fp"].is_string() && entry.contains("state")) {
        r.fingerprint = entry["fp"].get<std::string>();
        if (entry["state"] == "running" && entry.contains("until_ms") && entry["until_ms"].is_number_integer()) {
          r.what = Read::What::running;
          r.until_ms = entry["until_ms"].get<std::int64_t>();
        } else if (entry["state"] == "done" && entry.contains("response") && entry["response"].is_object()) {
          r.what = Read::What::done;
          r.response = entry["response"].dump();
        }
      }
    }
  }
  kvEntry_Destroy(e);
  return r;
}

std::uint32_t NatsKvStore::add_pending(Pending p) {
  std::lock_guard lock(mu_);
  if (!free_.empty()) {
    const std::uint32_t slot = free_.back();
    free_.pop_back();
    pending_[slot] = std::move(p);
    return slot;
  }
  pending_.push_back(std::move(p));
  return static_cast<std::uint32_t>(pending_.size() - 1);
}

NatsKvStore::Pending NatsKvStore::take_pending(std::uint32_t slot) {
  std::lock_guard lock(mu_);
  Pending p = std::move(pending_[slot]);
  pending_[slot] = Pending{};
  free_.push_back(slot);
  return p;
}

bool NatsKvStore::claim(Pending& p) {
  const json body = {{"state", "running"},
                     {"fp", p.fingerprint},
                     {"host", host_id_},
                     {"until_ms", unix_now_ms() + p.timeout_ms + o_.claim_grace_ms}};
  const std::string value = seal(p.store_key, body.dump());
  std::uint64_t revision = 0;
  if (kvStore_Create(&revision, kv_, p.store_key.c_str(), value.data(), static_cast<int>(value.size())) != NATS_OK) {
    return false;  // (held by another call, or the store failed: the read that follows says which)
  }
  p.revision = revision;
  return true;
}

Response NatsKvStore::forged(const std::string& store_key) {
  rejected_.fetch_add(1, std::memory_order_relaxed);
  say_("the shared idempotency store's entry " + store_key +
       " fails its authentication check (no host of this group wrote it): not replayed, and its call not run");
  return Response::failure(ErrorKind::internal_error,
                           "internal error: the shared idempotency store's entry for this idempotency_key fails its "
                           "authentication check (no host of the group wrote it); it is not replayed, and the call is "
                           "not run, since whether the tool ran under this key is unknown");
}

IdempotencyStore::Ticket NatsKvStore::answered(std::uint32_t slot, Response& answer, Response given) {
  take_pending(slot);
  answer = std::move(given);
  return Ticket{Outcome::answered};
}

IdempotencyStore::Ticket NatsKvStore::settle(std::uint32_t slot, const Read& r, Response& answer) {
  std::string store_key, fingerprint;
  {
    std::lock_guard lock(mu_);  // (the table may grow meanwhile: read under the lock)
    store_key = pending_[slot].store_key;
    fingerprint = pending_[slot].fingerprint;
  }
  switch (r.what) {
    case Read::What::forged: return answered(slot, answer, forged(store_key));
    case Read::What::failed:
      return answered(slot, answer,
                      Response::failure(ErrorKind::service_unavailable,
                                        "service_unavailable: the shared idempotency store cannot be read (" +
                                            r.failure + "); the call is not run"));
    case Read::What::running:
    case Read::What::done:
      if (r.fingerprint != fingerprint) {
        take_pending(slot);
        return Ticket{Outcome::conflict};
      }
      if (r.what == Read::What::running) {
        std::lock_guard lock(mu_);
        pending_[slot].until_ms = r.until_ms;
        return Ticket{Outcome::wait, slot};
      }
      {
        const json stored = json::parse(r.response, nullptr, false);
        Response hit;
        hit.kind = kind_of(stored.value("code", std::string("internal_error")));
        hit.output_json = stored.value("output_json", std::string());
        hit.error = stored.value("error", std::string());
        take_pending(slot);
        answer = std::move(hit);
        return Ticket{Outcome::hit};
      }
    case Read::What::none: break;
  }
  return Ticket{Outcome::wait, slot};  // (none: not reached, see callers)
}

IdempotencyStore::Ticket NatsKvStore::begin(const KeyedCall& call, Response& answer) {
  Pending p;
  p.store_key = "k" + sha256_hex({call.aid, std::string_view("\0", 1), call.key});
  p.fingerprint = mac("fp", call.aid, call.input_json);
  p.key_excerpt = excerpt_of(call.key);
  p.timeout_ms = call.timeout_ms;
  for (int attempt = 0; attempt < kClaimAttempts; ++attempt) {
    if (claim(p)) return Ticket{Outcome::run, add_pending(std::move(p))};
    const Read r = read(p.store_key);
    if (r.what == Read::What::none) continue;  // deleted in between (its call did not keep an answer): claim anew
    return settle(add_pending(std::move(p)), r, answer);
  }
  answer = Response::failure(ErrorKind::service_unavailable,
                             "service_unavailable: the shared idempotency store could not be claimed for this "
                             "idempotency_key (it kept changing hands, or the store fails); the call is not run");
  return Ticket{Outcome::answered};
}

IdempotencyStore::Ticket NatsKvStore::wait(const Ticket& ticket, Response& answer) {
  for (int attempt = 0; attempt < kClaimAttempts;) {
    std::string store_key;
    std::int64_t until_ms;
    {
      std::lock_guard lock(mu_);
      store_key = pending_[ticket.slot].store_key;
      until_ms = pending_[ticket.slot].until_ms;
    }
    if (unix_now_ms() >= until_ms) {
      std::string key;
      {
        std::lock_guard lock(mu_);
        key = pending_[ticket.slot].key_excerpt;
      }
      return answered(ticket.slot, answer,
                      Response::failure(ErrorKind::tool_crashed,
                                        "tool_crashed: the host that took idempotency key '" + key +
                                            "' stopped before answering; whether the tool ran is unknown, and it is "
                                            "not run again under this key"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(kPollMs));
    const Read r = read(store_key);
    if (r.what == Read::What::none) {
      // The claim's call kept no answer: the key is free, and this call may take it.
      ++attempt;
      Pending p;
      {
        std::lock_guard lock(mu_);
        p = pending_[ticket.slot];
      }
      if (claim(p)) {
        std::lock_guard lock(mu_);
        pending_[ticket.slot].revision = p.revision;
        return Ticket{Outcome::run, ticket.slot};
      }
      continue;
    }
    const Ticket next = settle(ticket.slot, r, answer);
    if (next.outcome != Outcome::wait) return next;
  }
  return answered(ticket.slot, answer,
                  Response::failure(ErrorKind::service_unavailable,
                                    "service_unavailable: the shared idempotency store's entry for this "
                                    "idempotency_key kept changing hands; the call is not run"));
}

void NatsKvStore::complete(const Ticket& ticket, const Response& response, bool keep, std::int64_t) noexcept {
  try {
    const Pending p = take_pending(ticket.slot);
    if (!keep) {
      // No answer kept: a retry may run the call again.
      if (const natsStatus s = kvStore_Delete(kv_, p.store_key.c_str()); s != NATS_OK) {
        say_("the shared idempotency store could not release " + p.store_key + ": " + nats_error(s) +
             " (the claim stands until its end)");
      }
      return;
    }
    std::string value = seal(
        p.store_key, json{{"state", "done"}, {"fp", p.fingerprint}, {"response", stored_response(response)}}.dump());
    if (value.size() > max_value_bytes_) {
      // Not room for the answer: later calls with the key are told so (and do not run it again).
      const Response too_large = Response::failure(
          ErrorKind::output_too_large,
          "output_too_large: the first call with this idempotency_key was answered, but its answer (" +
              std::to_string(value.size()) + " bytes) is larger than the shared idempotency store keeps (" +
              std::to_string(max_value_bytes_) +
              " bytes); it is not replayed, and the tool is not run again under "
              "this key");
      value = seal(p.store_key,
                   json{{"state", "done"}, {"fp", p.fingerprint}, {"response", stored_response(too_large)}}.dump());
    }
    if (const natsStatus s =
            kvStore_Update(nullptr, kv_, p.store_key.c_str(), value.data(), static_cast<int>(value.size()), p.revision);
        s != NATS_OK) {
      say_("the shared idempotency store could not keep the answer under " + p.store_key + ": " + nats_error(s) +
           " (its claim stands until its end; a duplicate then hears that the outcome is unknown)");
    }
  } catch (...) {
    // (out of memory: the claim stands until its end, as if this host had died)
  }
}

}  // namespace machina::cli
