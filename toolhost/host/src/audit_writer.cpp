// A pass of the audit writer: the records taken from the buffers read in place, digested
// (a call like the one before it is not digested again) and handed to the database and the
// JSON lines file in one transaction; the probe of a store that failed.

#include "audit_writer.hpp"

#include "audit_clock.hpp"

#include <machina/clock.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <utility>

namespace machina {

using namespace audit_detail;

AuditLog::Writer::Writer(const AuditOptions& options) : options_(options) {
  if (!options_.db_path.empty()) open_db();
  if (!options_.jsonl_path.empty()) open_jsonl();
  if (db_.is_open()) take_in_pending();
}

AuditLog::Writer::~Writer() {
  if (db_.is_open()) {
    try {
      prune();  // the bounds hold when the store is left, too
    } catch (const sql::Error& e) {
      complain(std::string("audit store ") + options_.db_path + ": " + e.what());
    }
  }
  if (jsonl_ >= 0) ::close(jsonl_);
}

std::size_t AuditLog::Writer::write(const std::vector<const AuditBytes*>& chunks, const TickLine& ticks, bool& ok) {
  const std::int64_t offset_ns = realtime_minus_steady_ns();
  std::size_t total = 0;
  ok = true;
  std::optional<sql::Transaction> tx;
  try {
    if (db_.is_open()) {
      tx.emplace(db_);
      next_call_ = next_call_id();
    }
    // The call and the one before it, in turn (not copied: a copy's fields stored one by
    // one and then compared as a word would stall on store forwarding).
    Call calls[2];
    for (const auto* chunk : chunks) {
      const char* p = chunk->data();
      const char* end = p + chunk->size;
      while (p < end) {
        Call& c = calls[total & 1];
        const Call& prev = calls[(total + 1) & 1];
        std::memcpy(&c.head, p, sizeof c.head);
        p += sizeof c.head;
        c.front = c.head.front_len != 0 ? std::string_view(p, c.head.front_len) : std::string_view("unknown");
        p += c.head.front_len;
        c.aid = std::string_view(p, c.head.aid_len);
        p += c.head.aid_len;
        c.user = std::string_view(p, c.head.user_len);
        p += c.head.user_len;
        c.input = std::string_view(p, c.head.input_len);
        p += c.head.input_len;
        const std::int64_t ended_ns = (c.head.flags & kTicks) != 0 ? ticks.ns(c.head.ended) : c.head.ended;
        c.ts_ms = ((c.head.flags & kUnix) != 0 ? ended_ns : ended_ns + offset_ns) / 1'000'000;
        c.duration_us = std::max<std::int64_t>(0, (ended_ns - c.head.started_ns) / 1000);
        if ((c.head.flags & kOsUser) != 0 && c.user.empty()) c.user = os_user();
        // Agents repeat calls: one like the last needs no digest, no names, no lookups.
        if (total == 0 || !c.same_call(prev)) {
          digest(c.input, (c.head.flags & kCut) != 0);
          // (a new input often digests as the last one did: the same shape again)
          if (db_.is_open() && (total == 0 || !c.same_but_input(prev) || args_ != shape_args_)) {
            batch_ = batch_for(shape_id(c));
            shape_args_ = args_;
          }
        }
        if (db_.is_open()) add(batches_[batch_], c);
        if (jsonl_ >= 0) jsonl_line(c);
        ++total;
      }
    }
    put_batches();
    if (jsonl_ >= 0) put_jsonl(jsonl_text_);
    if (std::exchange(jsonl_failed_, false)) ok = false;
    if (tx) {
      tx->commit();
      since_prune_ += total;
      const auto now = std::chrono::steady_clock::now();
      if (since_prune_ >= 100'000 || now - last_prune_ > std::chrono::seconds(10)) prune();
    }
  } catch (const sql::Error& e) {
    // The store is full or broken: say so (once a minute at most) and keep serving.
    tx.reset();  // rolled back: the ids it added are gone too
    forget_ids();
    open_batches_ = 0;
    batch_of_shape_.clear();
    jsonl_text_.clear();
    jsonl_failed_ = false;  // (this pass failed as a whole)
    std::size_t lost = 0;
    for (const auto* chunk : chunks) lost += count_records(*chunk);
    complain(std::string("audit store ") + options_.db_path + ": " + e.what() + " (" + std::to_string(lost) +
             " calls not recorded)");
    ok = false;
    return 0;
  }
  return total;
}

bool AuditLog::Writer::probe() {
  try {
    if (db_.is_open()) {
      sql::Transaction tx(db_);
      probe_.bind(1, audit_iso_time(unix_now_ms())).run();
      tx.commit();
    }
  } catch (const sql::Error& e) {
    complain(std::string("audit store ") + options_.db_path + ": " + e.what());
    return false;
  }
  if (jsonl_ < 0) return true;
  if (const int err = ::posix_fallocate(jsonl_, static_cast<off_t>(jsonl_bytes_), 64 * 1024); err != 0) {
    complain("audit JSON lines file " + options_.jsonl_path + ": " + std::strerror(err));
    return false;
  }
  return ::ftruncate(jsonl_, static_cast<off_t>(jsonl_bytes_)) == 0;
}

std::size_t AuditLog::Writer::count_records(const AuditBytes& chunk) {
  std::size_t n = 0;
  for (const char* p = chunk.data(); p < chunk.data() + chunk.size; ++n) {
    RecordHead h;
    std::memcpy(&h, p, sizeof h);
    p += record_bytes(h);
  }
  return n;
}

void AuditLog::Writer::digest(std::string_view input, bool cut) {
  if (cut || input.size() > kMaxCachedInput) {
    audit_digest_into(args_, input, cut, &path_);
    return;
  }
  DigestSlot& slot = digests_[std::hash<std::string_view>{}(input) % digests_.size()];
  if (slot.used && slot.input == input) {
    args_ = slot.args;
    path_ = slot.path;
    return;
  }
  audit_digest_into(args_, input, cut, &path_);
  slot.used = true;
  slot.input = input;
  slot.args = args_;
  slot.path = path_;
}

std::string_view AuditLog::Writer::os_user() {
  if (os_user_.empty()) {
    const std::string uid = std::to_string(::geteuid());
    std::ifstream passwd("/etc/passwd");
    std::string line;
    while (os_user_.empty() && std::getline(passwd, line)) {
      // name:password:uid:gid:...
      const std::size_t name_end = line.find(':');
      const std::size_t uid_start = name_end == std::string::npos ? name_end : line.find(':', name_end + 1);
      const std::size_t uid_end = uid_start == std::string::npos ? uid_start : line.find(':', uid_start + 1);
      if (uid_end != std::string::npos && name_end > 0 &&
          line.compare(uid_start + 1, uid_end - uid_start - 1, uid) == 0)
        os_user_ = line.substr(0, name_end);
    }
    if (os_user_.empty()) os_user_ = "uid:" + uid;
  }
  return os_user_;
}

void AuditLog::Writer::complain(const std::string& what) {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_complaint_ < std::chrono::minutes(1)) return;
  last_complaint_ = now;
  std::fprintf(stderr, "machina-toolhost: %s\n", what.c_str());
}

}  // namespace machina
