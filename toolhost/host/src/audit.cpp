// The audit log (audit.hpp): its life (options checked, the writer thread
// started and stopped), flushing, and the writer thread's loop.
#include <machina/audit.hpp>

#include "audit_clock.hpp"
#include "audit_record.hpp"
#include "audit_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <utility>

namespace machina {

using namespace audit_detail;

namespace {

std::atomic<std::uint64_t> next_log_id{1};

}  // namespace

AuditLog::AuditLog(AuditOptions options)
    : options_(std::move(options)), tsc_(!options_.pending && clock_runs_on_tsc()), id_(next_log_id.fetch_add(1)) {
  if (options_.retention_days < 1) throw ConfigError("the audit retention must be at least 1 day");
  if (options_.max_rows < 1) throw ConfigError("the audit store must keep at least 1 call");
  if (options_.buffer_bytes < 64 * 1024) throw ConfigError("the audit buffer must be at least 64 KiB");
  if (options_.pending && !options_.db_path.empty() && options_.jsonl_path.empty()) {
    const std::string path = options_.db_path + "-pending";
    pending_fd_ = open_owner_only(path, O_WRONLY | O_APPEND | O_NOFOLLOW);
    if (pending_fd_ < 0) throw ConfigError("audit store " + path + ": cannot open it: " + std::strerror(errno));
    return;
  }
  writer_ = std::make_unique<Writer>(options_);
  start_ = tick_point();
  thread_ = std::thread([this] { run(); });
}

AuditLog::~AuditLog() {
  if (pending_fd_ >= 0) {
    ::close(pending_fd_);
    return;
  }
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

bool AuditLog::comes_and_goes(std::string_view file) {
  for (std::string_view suffix : {"-wal", "-shm", "-journal", "-pending"}) {
    if (file.ends_with(suffix)) return true;
  }
  return false;
}

std::vector<std::string> AuditLog::files() const {
  std::vector<std::string> out;
  if (!options_.db_path.empty()) {
    for (const char* suffix : {"", "-wal", "-shm", "-journal", "-pending"}) out.push_back(options_.db_path + suffix);
  }
  if (!options_.jsonl_path.empty()) {
    out.push_back(options_.jsonl_path);
    out.push_back(options_.jsonl_path + ".1");
  }
  return out;
}

bool AuditLog::can_record() {
  if (healthy_.load() || pending_fd_ >= 0) return true;  // (a pending file is tried with each call)
  flush();
  return healthy_.load();
}

bool AuditLog::record_committed(const AuditCall& call) {
  if (pending_fd_ >= 0) return append_pending(call);
  const std::uint64_t failed = failed_writes_.load();
  record(call);
  flush();
  return failed_writes_.load() == failed && healthy_.load();
}

void AuditLog::flush() {
  if (pending_fd_ >= 0) return;  // (each call is written as it is recorded)
  std::unique_lock lock(mu_);
  const std::uint64_t target = ++flush_asked_;
  wake_.notify_all();
  flushed_.wait(lock, [&] { return flush_done_ >= target; });
}

void AuditLog::run() {
  std::vector<std::shared_ptr<Buffer>> buffers;
  std::vector<const AuditBytes*> chunks;
  // Ticks become time by the line through two readings of both: one taken after the
  // buffers were last taken (or at the start) and one taken now, after taking them, so a
  // record's ticks lie between the two (a record made by a thread that waited for room in
  // a full buffer may lie a little before the first: the line extends to it). The older
  // reading moves on once the line is a millisecond long (shorter lines magnify the
  // readings' few ns of error).
  TickPoint from = start_;
  for (;;) {
    std::uint64_t asked = 0, flush_done_seen = 0;
    bool stopping = false;
    {
      std::unique_lock lock(mu_);
      wake_.wait_for(lock, std::chrono::milliseconds(options_.flush_interval_ms),
                     [&] { return stop_ || flush_asked_ > flush_done_ || pressure_.load(std::memory_order_relaxed); });
      pressure_.store(false, std::memory_order_relaxed);
      stopping = stop_;
      asked = flush_asked_;
      flush_done_seen = flush_done_;
      // A buffer only this log still holds belongs to a thread that has ended: once
      // drained (below, on an earlier pass), it goes.
      std::erase_if(buffers_, [](const auto& b) { return b.use_count() == 1 && b->data.empty() && b->taken.empty(); });
      buffers = buffers_;
    }
    chunks.clear();
    for (const auto& b : buffers) {
      b->acquire();
      std::swap(b->taken, b->data);
      b->release();
      if (b->waiting.load()) {
        {
          std::lock_guard lock(b->wait_mu);
          b->waiting.store(false);
        }
        b->space.notify_all();
      }
      if (!b->taken.empty()) chunks.push_back(&b->taken);
    }
    const TickPoint now = tick_point();
    std::optional<bool> ok;  // whether this pass wrote what it took (none: it wrote nothing)
    if (!chunks.empty()) {
      try {
        bool all = false;
        written_.fetch_add(writer_->write(chunks, TickLine(from, now), all), std::memory_order_relaxed);
        ok = all;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "machina-toolhost: audit: %s\n", e.what());
        ok = false;
      }
    } else if (asked > flush_done_seen && !healthy_.load()) {
      ok = writer_->probe();  // asked whether the store records again, with nothing to write
    }
    if (ok) {
      if (!*ok) failed_writes_.fetch_add(1);
      healthy_.store(*ok);
    }
    for (const auto& b : buffers) b->taken.clear();
    buffers.clear();
    if (now.ns - from.ns >= 1'000'000) from = now;
    {
      std::lock_guard lock(mu_);
      flush_done_ = std::max(flush_done_, asked);
    }
    flushed_.notify_all();
    if (stopping) return;
  }
}

}  // namespace machina
