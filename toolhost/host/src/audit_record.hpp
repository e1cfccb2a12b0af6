// How the audit log keeps a recorded call until its writer takes it: a fixed head and its
// front, aid, user and input bytes, appended to the recording thread's buffer (or to the pending
// file); the buffers themselves.
#pragma once

#include <machina/audit.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

namespace machina {
namespace audit_detail {

/// How a call is laid out in a thread's buffer: this head, then its front, aid, user and
/// input bytes.
struct RecordHead {
  std::uint32_t aid_len;
  std::uint32_t user_len;
  std::uint32_t input_len;
  std::uint8_t front_len;  // (without kFrontNamed, in a pending file: a front's number, no bytes)
  std::uint8_t flags;      // 1: idempotent hit; 2: input cut
  std::uint16_t kind;
  std::int64_t started_ns;
  std::int64_t ended;  // steady-clock ns, or the log's ticks (kTicks)
  std::uint64_t input_bytes;
  std::uint64_t output_bytes;
};
// kUnix: started_ns and ended are nanoseconds of the realtime clock (a pending file's
// records, written by another process). kOsUser: the caller is the OS user (AuditCall::os_user).
// kFrontNamed: the front's name follows the head (set on every record; a pending file may
// hold records of a build that numbered the fronts instead).
constexpr std::uint8_t kHit = 1, kCut = 2, kTicks = 4, kUnix = 8, kOsUser = 16, kFrontNamed = 32;

/// Bytes of a record: its head and what follows it.
inline std::size_t record_bytes(const RecordHead& h) {
  return sizeof h + ((h.flags & kFrontNamed) != 0 ? h.front_len : 0) + std::size_t{h.aid_len} + h.user_len +
         h.input_len;
}

// Past this many bytes in a thread's buffer (or a quarter of the buffer, if that is less)
// the writer is woken rather than left to its next round.
constexpr std::size_t kWakeBytes = 2u << 20;

}  // namespace audit_detail

/// Bytes that keep their memory when emptied (no zero-filling as they grow).
struct AuditBytes {
  std::unique_ptr<char[]> p;
  std::size_t size = 0, cap = 0;

  const char* data() const { return p.get(); }
  bool empty() const { return size == 0; }
  void clear() { size = 0; }
  /// Room for `n` more bytes (at most `limit` in all): false if they would not fit.
  bool reserve_more(std::size_t n, std::size_t limit) {
    if (size + n <= cap) return true;
    if (size + n > limit && size > 0) return false;
    const std::size_t grown = std::max({size + n, std::min(cap * 2, limit), std::size_t{64} * 1024});
    auto bigger = std::make_unique_for_overwrite<char[]>(grown);
    if (size > 0) std::memcpy(bigger.get(), p.get(), size);
    p = std::move(bigger);
    cap = grown;
    return true;
  }
};

/// One recording thread's buffer. The thread appends under `lock` (a flag: the only other
/// taker is the writer, once per pass); a thread that finds it full waits on `space`.
struct AuditLog::Buffer {
  std::atomic_flag lock;
  AuditBytes data;   // records appended by the thread
  AuditBytes taken;  // the writer's side (only the writer touches it)
  std::mutex wait_mu;
  std::condition_variable space;  // the writer took the data: room again
  std::atomic<bool> waiting{false};

  void acquire() {
    for (int spins = 0; lock.test_and_set(std::memory_order_acquire); ++spins) {
      if (spins > 64) std::this_thread::yield();
    }
  }
  void release() { lock.clear(std::memory_order_release); }
};

}  // namespace machina
