// Recording a call (AuditLog::record): a copy into the calling thread's own buffer under
// a flag only the writer also takes; a thread whose buffer is full waits for the writer.
#include "audit_record.hpp"

#include <machina/audit.hpp>

#include <cstddef>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

namespace machina {

using namespace audit_detail;

namespace {
// The buffer this thread used last, and its log's id (plain values: no guard on access).
thread_local std::uint64_t last_id = 0;
thread_local AuditLog::Buffer* last = nullptr;
}  // namespace

AuditLog::Buffer& AuditLog::buffer_of_this_thread() {
  // The last buffer this thread used, then the thread's buffers by log. An entry whose log
  // has gone (the log no longer shares its buffer) is dropped when the list grows.
  if (last_id == id_) [[likely]]
    return *last;
  thread_local std::vector<std::pair<std::uint64_t, std::shared_ptr<Buffer>>> mine;
  for (auto& [id, buffer] : mine) {
    if (id == id_) {
      last_id = id;
      last = buffer.get();
      return *buffer;
    }
  }
  if (mine.size() >= 8) {
    std::erase_if(mine, [](const auto& entry) { return entry.second.use_count() == 1; });
  }
  auto buffer = std::make_shared<Buffer>();
  {
    std::lock_guard lock(mu_);
    buffers_.push_back(buffer);
  }
  mine.emplace_back(id_, buffer);
  last_id = id_;
  last = buffer.get();
  return *last;
}

namespace {
/// Puts one field of a record's head in place (the buffer is not aligned for a RecordHead;
/// a head built aside and copied whole costs a store-forwarding stall on its narrow fields).
template <typename T>
void put(char* head, std::size_t offset, T value) {
  std::memcpy(head + offset, &value, sizeof value);
}
static_assert(std::is_standard_layout_v<RecordHead>);  // (offsetof below)
}  // namespace

void AuditLog::record(const AuditCall& call) {
  if (pending_fd_ >= 0) [[unlikely]] {
    (void)append_pending(call);
    return;
  }
  Buffer& b = buffer_of_this_thread();
  const auto aid_len = static_cast<std::uint32_t>(std::min(call.aid.size(), kAuditMaxAid));
  const auto user_len = static_cast<std::uint32_t>(std::min<std::size_t>(call.user.size(), 256));
  const auto input_len = static_cast<std::uint32_t>(std::min(call.input_json.size(), kAuditMaxInput));
  const auto front_len = static_cast<std::uint8_t>(std::min(call.front.size(), kAuditMaxFront));
  const std::size_t need = sizeof(RecordHead) + front_len + aid_len + user_len + input_len;
  b.acquire();
  while (!b.data.reserve_more(need, options_.buffer_bytes)) {
    // Full: the writer has fallen behind. Wait for it to take the buffer (a record is
    // never dropped); the thread is told, or looks again after a while.
    b.release();
    {
      std::unique_lock lock(b.wait_mu);
      b.waiting.store(true);
      wake_.notify_one();
      b.space.wait_for(lock, std::chrono::milliseconds(10), [&] { return !b.waiting.load(); });
    }
    b.acquire();
  }
  // Past kWakeBytes the writer is woken rather than left to its next round. The mark is
  // high on purpose: each early wake is an extra transaction, and a writer woken often
  // slows the recording threads more than the wait for its round does.
  const std::size_t wake_at = std::min(kWakeBytes, options_.buffer_bytes / 4);
  const bool wake = b.data.size < wake_at && b.data.size + need >= wake_at;
  char* p = b.data.p.get() + b.data.size;
  put(p, offsetof(RecordHead, aid_len), aid_len);
  put(p, offsetof(RecordHead, user_len), user_len);
  put(p, offsetof(RecordHead, input_len), input_len);
  put(p, offsetof(RecordHead, front_len), front_len);
  put(p, offsetof(RecordHead, flags),
      static_cast<std::uint8_t>(kFrontNamed | (call.idempotent_hit ? kHit : 0) |
                                (call.input_json.size() > kAuditMaxInput ? kCut : 0) |
                                (call.ended_ns == 0 ? kTicks : 0) | (call.os_user ? kOsUser : 0)));
  put(p, offsetof(RecordHead, kind), static_cast<std::uint16_t>(call.kind));
  put(p, offsetof(RecordHead, started_ns), call.started_ns);
  put(p, offsetof(RecordHead, ended), call.ended_ns != 0 ? call.ended_ns : call.ended_ticks);
  put(p, offsetof(RecordHead, input_bytes), static_cast<std::uint64_t>(call.input_json.size()));
  put(p, offsetof(RecordHead, output_bytes), static_cast<std::uint64_t>(call.output_bytes));
  p += sizeof(RecordHead);
  // An empty view may hold a null pointer, which memcpy must not be given even for 0 bytes.
  const std::string_view parts[] = {call.front.substr(0, front_len), call.aid.substr(0, aid_len),
                                    call.user.substr(0, user_len), call.input_json.substr(0, input_len)};
  for (const std::string_view part : parts) {
    if (!part.empty()) std::memcpy(p, part.data(), part.size());
    p += part.size();
  }
  b.data.size += need;
  b.release();
  if (wake) {
    pressure_.store(true, std::memory_order_relaxed);
    wake_.notify_one();
  }
}

}  // namespace machina
