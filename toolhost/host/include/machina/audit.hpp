// The audit store: every tool call, through every front, recorded — when it ended, the
// tool, the front, the caller's user, a bounded digest of its arguments (paths, commands
// and queries in full; contents never), its status and error type, its duration — into a
// SQLite database (WAL) bounded by retention settings, and optionally as JSON lines.
//
// Recording costs the calling thread a read of the CPU's time-stamp counter (where the
// kernel keeps time by it; else a clock read) and a copy into a buffer of its own;
// everything else (ticks to time, digests, names, SQL) happens on the log's writer thread,
// in batches.
// A thread whose buffer is full waits for the writer: a record is never dropped.
// A store that cannot record (its disk full, its file gone) does not fail open: the calls
// AuditOptions::required names are refused (audit_unavailable) until it records again.
// Credentials in what is kept are masked; the store's files are its owner's only (0600).
// See docs/tool-packs.md (the audit store) for the schema and `machina-toolhost audit report`.
#pragma once

#include <machina/clock.hpp>
#include <machina/errors.hpp>
#include <machina/request.hpp>

#include <nlohmann/json_fwd.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace machina {

/// Which calls the store must be able to record before they are answered.
enum class AuditRequired {
  none,    // none: a store that cannot record loses the calls and says so on stderr
  leased,  // the calls of tools of tier > 0 (the ones a lease is for)
  all,     // every call that reaches a tool
};

struct AuditOptions {
  std::string db_path;                         // the SQLite database ("" with jsonl_path "": no audit)
  std::string jsonl_path;                      // also one JSON line per call ("" : none)
  std::int64_t retention_days = 30;            // older calls are deleted
  std::int64_t max_rows = 10'000'000;          // the oldest calls beyond this are deleted
  std::uint64_t jsonl_max_bytes = 100u << 20;  // the JSON lines file is rotated (to FILE.1) past this
  std::size_t buffer_bytes = 8u << 20;         // per recording thread: past this it waits for the writer
  std::int64_t flush_interval_ms = 5;          // how often the writer takes what the threads recorded (sooner
                                               // when a thread has recorded 2 MiB, or a quarter of buffer_bytes)
  AuditRequired required = AuditRequired::leased;
  // Each call is appended to the pending file (db_path + "-pending") instead, in one write,
  // and no database is opened: for a process of one call. The next process that opens the
  // database (any other front, `audit report`, or this mode once the file holds
  // kAuditPendingImportBytes) takes the pending calls in.
  bool pending = false;
  // A store that cannot be opened is not an error: the host says so once on stderr and
  // records nothing (the default store; a store named on purpose must open).
  bool optional = false;

  bool enabled() const { return !db_path.empty() || !jsonl_path.empty(); }
};

/// What a call was, as the host saw it when it answered.
struct AuditCall {
  std::string_view front;  // the front's name (FrontLabel::name); "" is recorded as "unknown"
  ErrorKind kind = ErrorKind::none;
  bool idempotent_hit = false;
  std::int64_t started_ns = 0;   // steady clock
  std::int64_t ended_ns = 0;     // steady clock; 0: ended_ticks says when
  std::int64_t ended_ticks = 0;  // AuditLog::ticks() when the call ended (cheaper to read)
  std::string_view aid;
  std::string_view user;        // "" when none
  bool os_user = false;         // with no user: the caller is this process's OS user (recorded by name)
  std::string_view input_json;  // digested on the writer thread; never stored
  std::size_t output_bytes = 0;
};

/// The schema a store holds (its meta table says): a store of another is refused.
/// (A store of schema 2 differs only in its call_log view, which lacks duration_ms: it is
/// migrated when opened.)
inline constexpr std::string_view kAuditSchema = "machina-toolhost audit 3";
inline constexpr std::string_view kAuditSchemaMigrated = "machina-toolhost audit 2";
/// The size of a pending file (AuditOptions::pending) past which the process that wrote it
/// takes it into the database.
inline constexpr std::uint64_t kAuditPendingImportBytes = 1u << 20;

/// Limits of what one record keeps of a call.
inline constexpr std::size_t kAuditMaxAid = 256;          // bytes of the aid
inline constexpr std::size_t kAuditMaxFront = 32;         // bytes of the front's name
inline constexpr std::size_t kAuditMaxInput = 16 * 1024;  // bytes of the input the digest is made from
inline constexpr std::size_t kAuditMaxDigest = 2048;      // bytes of the digest
inline constexpr std::size_t kAuditMaxValue = 1024;       // bytes of one path/command/query kept

/// A call's arguments as they are kept: a JSON object text of at most kAuditMaxDigest
/// bytes. Members named like paths, commands and queries (path, cwd, command, args,
/// pattern, query, url, …) keep their values (each cut at kAuditMaxValue); booleans and
/// null keep theirs; every other value is replaced by its kind ("<number>", "<array>",
/// "<object>") or, for a string, its kind and size ("<string, 12 bytes>"). An input that is
/// not an object (or not JSON, or cut) is described the same way. `path` is set to the
/// first path-like member's value.
/// Credentials in kept values are masked (AuditCredentialMask).
std::string audit_digest(std::string_view input_json, bool input_cut, std::string* path);
void audit_digest_into(std::string& out, std::string_view input_json, bool input_cut, std::string* path);

/// Masks credentials in the values the store keeps with "***": the password of a URL's user
/// (`https://user:***@host`), the values of query parameters, assignments and flags named
/// like credentials (`token=***`, `--password=***`, `--password ***`, `API_KEY=***`), what
/// follows `Bearer` or a header such as `Authorization:` or `X-Api-Key:`, the password of
/// `-u name:***`, and a mysql client's `-p***`. A flag's value may be the next word or the
/// next element of an array: one mask masks a member's values in turn (reset() between
/// members).
class AuditCredentialMask {
 public:
  std::string masked(std::string_view text);
  void reset();

 private:
  std::string word(std::string_view w);
  enum class Next { none, value, auth_value, user };
  Next next_ = Next::none;
  bool program_seen_ = false;  // the first word (the program) was seen
  bool mysql_ = false;         // it is a mysql client (whose -pSECRET is a password)
};

class AuditLog {
 public:
  /// Opens (or makes) the store; throws ConfigError when it cannot (a bad path, a database
  /// of another schema, a JSON lines file that cannot be opened).
  explicit AuditLog(AuditOptions options);
  /// Writes everything recorded, then closes the store.
  ~AuditLog();
  AuditLog(const AuditLog&) = delete;
  AuditLog& operator=(const AuditLog&) = delete;

  /// Records one call (thread-safe; cheap: see above).
  void record(const AuditCall& call);
  /// Takes the calls of the store's pending file (AuditOptions::pending) into its database,
  /// if there are any; throws ConfigError when the database cannot be opened.
  static void take_in_pending(const AuditOptions& options);
  /// Now, in the log's ticks: the time-stamp counter when the kernel's clock runs on it
  /// (the counter then runs at one rate on every CPU), else the steady clock's nanoseconds.
  /// The writer turns ticks into time by the line through its readings of both before and
  /// after the record was taken.
  std::int64_t ticks() const noexcept {
#if defined(__x86_64__)
    if (tsc_) return static_cast<std::int64_t>(__rdtsc());
#endif
    return steady_now_ns();
  }
  bool ticks_are_tsc() const { return tsc_; }
  /// Blocks until every call recorded before this one is written (and committed).
  void flush();

  /// Whether a call of a tool of this tier must be recordable before it is answered
  /// (AuditOptions::required).
  bool must_record(int tier) const {
    return options_.required == AuditRequired::all || (options_.required == AuditRequired::leased && tier > 0);
  }
  /// Whether the store's last write succeeded. When it did not, the writer is asked to
  /// write what is waiting (or, with nothing waiting, to try a write of its own) and the
  /// answer is whether that succeeded.
  bool can_record();
  /// Records one call and waits until the writer has written it: true when it committed
  /// (false also when a write of other calls failed in the meantime).
  bool record_committed(const AuditCall& call);

  const AuditOptions& options() const { return options_; }
  /// The files of the store (database, its WAL and shared-memory files, the JSON lines):
  /// no tool may reach them.
  std::vector<std::string> files() const;
  /// Whether `file` (one of files()) comes and goes while the store is used (the WAL,
  /// shared-memory, journal and pending files, deleted and made again): its inode is
  /// reused by other files once it is gone, so it cannot be protected by its identity.
  static bool comes_and_goes(std::string_view file);
  /// Calls written so far (for tests and stats).
  std::uint64_t written() const { return written_.load(std::memory_order_relaxed); }

  struct Buffer;  // one recording thread's (audit.cpp)

 private:
  class Writer;
  struct TickPoint {  // the ticks and the steady clock, read together
    std::int64_t ticks = 0, ns = 0;
  };
  struct TickLine {  // ticks to steady-clock ns, by the line through two readings
    TickLine(TickPoint from, TickPoint to);
    std::int64_t ns(std::int64_t ticks) const {
      return to.ns + static_cast<std::int64_t>(static_cast<double>(ticks - to.ticks) * ns_per_tick);
    }
    TickPoint to;
    double ns_per_tick = 1;
  };
  TickPoint tick_point() const;
  Buffer& buffer_of_this_thread();
  /// Appends one call to the pending file: whether the write succeeded.
  bool append_pending(const AuditCall& call);
  void run();

  AuditOptions options_;
  const bool tsc_;          // ticks() reads the time-stamp counter
  const std::uint64_t id_;  // tells this log apart from an earlier one at the same address
  TickPoint start_;         // read before the writer starts
  std::unique_ptr<Writer> writer_;
  std::mutex mu_;  // buffers_, wake_, and the writer's sleep
  std::condition_variable wake_;
  std::condition_variable flushed_;
  std::vector<std::shared_ptr<Buffer>> buffers_;
  std::uint64_t flush_asked_ = 0, flush_done_ = 0;
  bool stop_ = false;
  std::atomic<std::uint64_t> written_{0};
  std::atomic<bool> pressure_{false};  // a thread's buffer passed the wake mark
  std::atomic<bool> healthy_{true};    // the writer's last write succeeded
  std::atomic<std::uint64_t> failed_writes_{0};
  int pending_fd_ = -1;  // the pending file (AuditOptions::pending)
  std::thread thread_;
};

/// Milliseconds since the epoch as UTC ISO 8601 with milliseconds (2026-11-25T14:30:05.123Z).
std::string audit_iso_time(std::int64_t unix_ms);

/// What `machina-toolhost audit report` answers: calls in [since, until) (unix ms; none:
/// unbounded), the `top` most used tools, accessed paths and active users, and for every
/// tool its calls, error rate, errors by type and latency percentiles (nearest rank).
struct AuditReportOptions {
  std::string db_path;
  std::optional<std::int64_t> since_ms, until_ms;
  std::size_t top = 10;
};
/// Throws ConfigError for a missing store, one of another schema, or an unreadable one.
nlohmann::json audit_report(const AuditReportOptions& options);
std::string audit_report_text(const nlohmann::json& report);
/// A time for --since / --until: YYYY-MM-DD[THH:MM[:SS]][Z] in UTC, `now`, or a span back
/// from now (90s, 30m, 24h, 7d). Throws ConfigError otherwise.
std::int64_t parse_audit_time(const std::string& text, std::int64_t now_ms);

}  // namespace machina
