// The audit store's pending file (AuditOptions::pending): a process of one call appends its
// record in one write under a shared lock; whoever opens the database takes the file in
// under an exclusive one.
#include "audit_clock.hpp"
#include "audit_writer.hpp"

#include <machina/fd_io.hpp>

#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <string>
#include <string_view>

namespace machina {

using namespace audit_detail;

namespace {

/// `chunk`'s records, those that number their front (written by a build that knew a fixed
/// list of fronts) given the name that number stood for.
AuditBytes with_front_names(const AuditBytes& chunk) {
  static constexpr std::string_view kNumberedFronts[] = {"unknown", "run",  "serve",  "mcp",
                                                         "skill",   "http", "python", "nats"};
  AuditBytes out;
  (void)out.reserve_more(chunk.size + chunk.size / 2 + 64, SIZE_MAX);
  for (const char* p = chunk.data(); p < chunk.data() + chunk.size;) {
    RecordHead h;
    std::memcpy(&h, p, sizeof h);
    const std::size_t len = record_bytes(h);
    std::string_view front;
    if ((h.flags & kFrontNamed) == 0) {
      front = h.front_len < std::size(kNumberedFronts) ? kNumberedFronts[h.front_len] : kNumberedFronts[0];
      h.front_len = static_cast<std::uint8_t>(front.size());
      h.flags |= kFrontNamed;
    }
    (void)out.reserve_more(sizeof h + front.size() + (len - sizeof h), SIZE_MAX);
    char* q = out.p.get() + out.size;
    std::memcpy(q, &h, sizeof h);
    if (!front.empty()) std::memcpy(q + sizeof h, front.data(), front.size());
    std::memcpy(q + sizeof h + front.size(), p + sizeof h, len - sizeof h);
    out.size += sizeof h + front.size() + (len - sizeof h);
    p += len;
  }
  return out;
}

}  // namespace

void AuditLog::take_in_pending(const AuditOptions& options) {
  AuditOptions o = options;
  o.pending = false;
  o.jsonl_path.clear();
  Writer taker(o);  // (opening the database takes the pending file in)
}

bool AuditLog::append_pending(const AuditCall& call) {
  const std::int64_t offset_ns = realtime_minus_steady_ns();
  const std::int64_t ended_ns = call.ended_ns != 0 ? call.ended_ns : call.ended_ticks;  // (ticks are ns here)
  const auto aid = call.aid.substr(0, kAuditMaxAid), user = call.user.substr(0, 256);
  const auto input = call.input_json.substr(0, kAuditMaxInput), front = call.front.substr(0, kAuditMaxFront);
  RecordHead head{};
  head.aid_len = static_cast<std::uint32_t>(aid.size());
  head.user_len = static_cast<std::uint32_t>(user.size());
  head.input_len = static_cast<std::uint32_t>(input.size());
  head.front_len = static_cast<std::uint8_t>(front.size());
  head.flags =
      static_cast<std::uint8_t>(kUnix | kFrontNamed | (call.idempotent_hit ? kHit : 0) |
                                (call.input_json.size() > kAuditMaxInput ? kCut : 0) | (call.os_user ? kOsUser : 0));
  head.kind = static_cast<std::uint16_t>(call.kind);
  head.started_ns = call.started_ns + offset_ns;
  head.ended = ended_ns + offset_ns;
  head.input_bytes = call.input_json.size();
  head.output_bytes = call.output_bytes;
  std::string record(reinterpret_cast<const char*>(&head), sizeof head);
  record.append(front).append(aid).append(user).append(input);
  // One write under a shared lock: whoever takes the file in holds it exclusively.
  ::flock(pending_fd_, LOCK_SH);
  const bool written = write_all(pending_fd_, record);
  const int err = errno;
  ::flock(pending_fd_, LOCK_UN);
  if (!written) {
    std::fprintf(stderr, "machina-toolhost: audit store %s-pending: %s (a call not recorded)\n",
                 options_.db_path.c_str(), std::strerror(err != 0 ? err : ENOSPC));
    healthy_.store(false);
    return false;
  }
  healthy_.store(true);
  // A pending file that has grown is taken in by the process that finds it so.
  struct stat st{};
  if (::fstat(pending_fd_, &st) == 0 && static_cast<std::uint64_t>(st.st_size) >= kAuditPendingImportBytes) {
    try {
      take_in_pending(options_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "machina-toolhost: %s\n", e.what());
    }
  }
  return true;
}

void AuditLog::Writer::take_in_pending() {
  const std::string path = options_.db_path + "-pending";
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return;
  (void)::fchmod(fd, 0600);
  ::flock(fd, LOCK_EX);
  AuditBytes chunk;
  struct stat st{};
  if (::fstat(fd, &st) == 0 && st.st_size > 0 && chunk.reserve_more(static_cast<std::size_t>(st.st_size), SIZE_MAX)) {
    while (chunk.size < static_cast<std::size_t>(st.st_size)) {
      const ssize_t n = ::pread(fd, chunk.p.get() + chunk.size, static_cast<std::size_t>(st.st_size) - chunk.size,
                                static_cast<off_t>(chunk.size));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      chunk.size += static_cast<std::size_t>(n);
    }
    // Whole records only (a writer that died mid-append leaves a part of one).
    std::size_t whole = 0;
    bool numbered = false;
    while (whole + sizeof(RecordHead) <= chunk.size) {
      RecordHead h;
      std::memcpy(&h, chunk.data() + whole, sizeof h);
      const std::size_t len = record_bytes(h);
      if ((h.flags & kUnix) == 0 || h.aid_len > kAuditMaxAid || h.input_len > kAuditMaxInput ||
          ((h.flags & kFrontNamed) != 0 && h.front_len > kAuditMaxFront) || whole + len > chunk.size)
        break;
      numbered |= (h.flags & kFrontNamed) == 0;
      whole += len;
    }
    chunk.size = whole;
    if (numbered) chunk = with_front_names(chunk);
    bool ok = true;
    if (chunk.size > 0) write({&chunk}, TickLine({}, {}), ok);
    if (ok) (void)::ftruncate(fd, 0);
  }
  ::flock(fd, LOCK_UN);
  ::close(fd);
}

}  // namespace machina
