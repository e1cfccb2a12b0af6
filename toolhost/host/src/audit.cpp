// See audit.hpp.
#include <machina/audit.hpp>
#include <machina/json_text.hpp>
#include <machina/rapid_sax.hpp>
#include <machina/sqlite_db.hpp>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <type_traits>
#include <unordered_map>
#include <utility>

namespace machina {

std::string_view front_name(Front front) {
  switch (front) {
    case Front::run: return "run";
    case Front::serve: return "serve";
    case Front::mcp: return "mcp";
    case Front::skill: return "skill";
    case Front::http: return "http";
    case Front::python: return "python";
    case Front::nats: return "nats";
    case Front::unknown: break;
  }
  return "unknown";
}

namespace {

/// The error type of a kind (error_kinds.def); "" for success.
std::string_view error_type(ErrorKind kind) { return error_info(kind).error_type; }

// --- the digest of a call's arguments -----------------------------------------------

/// Members whose values are kept (cut at kAuditMaxValue): where a call reaches, what it runs.
bool kept_member(std::string_view key) {
  static constexpr std::array<std::string_view, 18> kKept = {
      "path", "paths", "cwd", "file", "filename", "dir", "directory", "target", "command", "args",
      "pattern", "query", "url", "codebase_id", "package", "packages", "install_packages", "session_id"};
  return std::find(kKept.begin(), kKept.end(), key) != kKept.end();
}
bool path_member(std::string_view key) {
  return key == "path" || key == "file" || key == "filename" || key == "dir" || key == "directory" || key == "cwd";
}

std::string cut_utf8(std::string_view s, std::size_t n) {
  if (s.size() <= n) return std::string(s);
  std::size_t end = n;
  while (end > 0 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) --end;
  return std::string(s.substr(0, end)) + "…";
}

/// Builds the digest from SAX events of the input (RapidJSON's fast path), straight into
/// one string.
class DigestSax {
 public:
  DigestSax(std::string& out, std::string* path) : out_(out), path_(path) { out_.assign(1, '{'); }

  bool null() { return literal("null"); }
  bool boolean(bool b) { return literal(b ? "true" : "false"); }
  bool number_integer(std::int64_t) { return number(); }
  bool number_unsigned(std::uint64_t) { return number(); }
  bool number_float(double, const std::string&) { return number(); }
  bool string_view_value(std::string_view v) {
    if (depth_ == 0) {
      top_ = "string";
      return true;
    }
    if (depth_ == 1) {
      if (keep_) {
        const std::string kept = mask_.masked(v);
        if (path_ != nullptr && path_->empty() && path_member(key_)) *path_ = cut_utf8(kept, kAuditMaxValue);
        value_cut(kept);
      } else {
        described("<string, ", v.size(), " bytes>");
      }
    } else if (depth_ == 2 && in_kept_array_) {
      element_cut(mask_.masked(v));
    }
    return true;
  }
  bool key_view(std::string_view k) {
    if (depth_ == 1) {
      key_.assign(k);
      keep_ = kept_member(k);
      mask_.reset();
    }
    return true;
  }
  bool start_object(std::size_t) { return open(false); }
  bool start_array(std::size_t) { return open(true); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  /// Closes the digest (call once, after the parse).
  void finish(std::size_t input_bytes) {
    if (top_ != nullptr) {
      out_.assign("{\"<input>\":\"<");
      out_.append(top_).append(", ").append(std::to_string(input_bytes)).append(" bytes>\"}");
      return;
    }
    if (dropped_ > 0) {
      if (members_ > 0) out_ += ',';
      out_.append("\"<more>\":\"").append(std::to_string(dropped_)).append(" more members\"");
    }
    out_ += '}';
  }

 private:
  // A member is written as `"key":` then its value; past the bound it is taken back.
  bool begin_member() {
    mark_ = out_.size();
    if (out_.size() + key_.size() + 80 > kAuditMaxDigest) {
      ++dropped_;
      return false;
    }
    if (members_ > 0) out_ += ',';
    append_json_string(out_, std::string_view(key_).substr(0, 128));
    out_ += ':';
    return true;
  }
  void end_member() {
    if (out_.size() + 64 > kAuditMaxDigest) {  // the value was too long for what is left
      out_.resize(mark_);
      ++dropped_;
      return;
    }
    ++members_;
  }
  bool literal(const char* text) {
    if (depth_ == 0) top_ = "scalar";
    else if (depth_ == 1 && begin_member()) {
      out_ += text;
      end_member();
    } else if (depth_ == 2 && in_kept_array_) {
      element(text);
    }
    return true;
  }
  bool number() {
    if (depth_ == 0) top_ = "number";
    else if (depth_ == 1 && begin_member()) {
      out_ += "\"<number>\"";
      end_member();
    } else if (depth_ == 2 && in_kept_array_) {
      element("\"<number>\"");
    }
    return true;
  }
  void described(const char* before, std::size_t n, const char* after) {
    if (!begin_member()) return;
    out_.append(1, '"').append(before).append(std::to_string(n)).append(after).append(1, '"');
    end_member();
  }
  void value_cut(std::string_view v) {
    if (!begin_member()) return;
    append_json_string(out_, cut_utf8(v, kAuditMaxValue));
    end_member();
  }
  // Elements of a kept array (a command's args), kept while the member's share lasts.
  void element(std::string_view json) {
    if (array_bytes_ + json.size() + 1 > kAuditMaxValue) {
      array_cut_ = true;
      return;
    }
    if (elements_ > 0) out_ += ',';
    out_.append(json);
    array_bytes_ += json.size() + 1;
    ++elements_;
  }
  void element_cut(std::string_view v) {
    std::string text;
    append_json_string(text, cut_utf8(v, kAuditMaxValue));
    element(text);
  }
  bool open(bool array) {
    ++depth_;
    if (depth_ == 1) {
      if (array) top_ = "array";
    } else if (depth_ == 2) {
      in_kept_array_ = keep_ && array;
      if (in_kept_array_) {
        if (begin_member()) {
          out_ += '[';
          elements_ = 0;
          array_bytes_ = 0;
          array_cut_ = false;
        } else {
          in_kept_array_ = false;
        }
      } else if (begin_member()) {
        out_ += array ? "\"<array>\"" : "\"<object>\"";  // (its size is not known yet: the kind says enough)
        end_member();
      }
    }
    return true;
  }
  bool close() {
    if (depth_ == 2 && in_kept_array_) {
      if (array_cut_) out_ += elements_ > 0 ? ",\"…\"" : "\"…\"";
      out_ += ']';
      end_member();
      in_kept_array_ = false;
    }
    --depth_;
    return true;
  }

  std::string& out_;
  std::string* path_;
  AuditCredentialMask mask_;  // over the values of one kept member
  int depth_ = 0;
  std::string key_;
  bool keep_ = false;
  bool in_kept_array_ = false, array_cut_ = false;
  std::size_t elements_ = 0, array_bytes_ = 0;
  std::size_t members_ = 0, dropped_ = 0, mark_ = 0;
  const char* top_ = nullptr;
};

}  // namespace

void audit_digest_into(std::string& out, std::string_view input_json, bool input_cut, std::string* path) {
  if (path != nullptr) path->clear();
  if (!input_cut) {
    DigestSax sax(out, path);
    if (detail::rapid_parse(input_json, sax) == detail::RapidOutcome::accepted) {
      sax.finish(input_json.size());
      return;
    }
  }
  // Not JSON RapidJSON takes whole (cut at kAuditMaxInput, not JSON at all, or one of the
  // rare texts only the reference parser judges): described, not digested.
  if (path != nullptr) path->clear();
  out.assign("{\"<input>\":\"<");
  out.append(input_cut ? "input cut at " : "input, ").append(std::to_string(input_json.size()));
  out.append(input_cut ? " bytes>\"}" : " bytes, not digested>\"}");
}

std::string audit_iso_time(std::int64_t unix_ms) {
  const time_t secs = static_cast<time_t>(unix_ms / 1000);
  tm t{};
  gmtime_r(&secs, &t);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", t.tm_year + 1900, t.tm_mon + 1, t.tm_mday,
                t.tm_hour, t.tm_min, t.tm_sec, static_cast<int>(unix_ms % 1000));
  return buf;
}

std::string audit_digest(std::string_view input_json, bool input_cut, std::string* path) {
  std::string out;
  audit_digest_into(out, input_json, input_cut, path);
  return out;
}

// --- recording ------------------------------------------------------------------------

namespace {

/// How a call is laid out in a thread's buffer: this head, then its aid, user and input bytes.
struct RecordHead {
  std::uint32_t aid_len;
  std::uint32_t user_len;
  std::uint32_t input_len;
  std::uint8_t front;
  std::uint8_t flags;  // 1: idempotent hit; 2: input cut
  std::uint16_t kind;
  std::int64_t started_ns;
  std::int64_t ended;  // steady-clock ns, or the log's ticks (kTicks)
  std::uint64_t input_bytes;
  std::uint64_t output_bytes;
};
// kUnix: started_ns and ended are nanoseconds of the realtime clock (a pending file's
// records, written by another process). kOsUser: the caller is the OS user (AuditCall::os_user).
constexpr std::uint8_t kHit = 1, kCut = 2, kTicks = 4, kUnix = 8, kOsUser = 16;

std::atomic<std::uint64_t> next_log_id{1};

std::int64_t realtime_minus_steady_ns() {
  timespec rt{}, mono{};
  clock_gettime(CLOCK_REALTIME, &rt);
  clock_gettime(CLOCK_MONOTONIC, &mono);
  return (static_cast<std::int64_t>(rt.tv_sec) - mono.tv_sec) * 1'000'000'000 + (rt.tv_nsec - mono.tv_nsec);
}

/// Whether the kernel keeps time by the time-stamp counter: it then runs at one rate and
/// agrees across CPUs (the kernel checked), so a read of it can stand for a clock read.
bool clock_runs_on_tsc() {
#if defined(__x86_64__)
  std::FILE* f = std::fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "re");
  if (f == nullptr) return false;
  char name[16] = {};
  const std::size_t n = std::fread(name, 1, sizeof name - 1, f);
  std::fclose(f);
  return n >= 4 && std::memcmp(name, "tsc\n", 4) == 0;
#else
  return false;
#endif
}

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// Opens (making it if need be) a file of the store readable and writable by its owner
/// only, whatever the umask and whatever mode an existing one had.
int open_owner_only(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CREAT | O_CLOEXEC, 0600);
  if (fd >= 0) (void)::fchmod(fd, 0600);
  return fd;
}

/// The view of a row per call with its names, as `SELECT ...` (docs/tool-packs.md).
constexpr const char* kCallLogSelect =
    "SELECT c.id, c.ts_ms, strftime('%Y-%m-%dT%H:%M:%fZ', c.ts_ms / 1000.0, 'unixepoch') AS time,"
    " t.name AS tool, f.name AS front, u.name AS user, k.status, k.code, k.error_type, c.duration_us,"
    " c.duration_us / 1000.0 AS duration_ms, c.input_bytes, c.output_bytes, s.idempotent_hit, a.path,"
    " a.digest AS args FROM calls c JOIN shapes s ON s.id = c.shape JOIN tools t ON t.id = s.tool"
    " JOIN fronts f ON f.id = s.front LEFT JOIN users u ON u.id = s.user JOIN codes k ON k.id = s.code"
    " JOIN args a ON a.id = s.args";

constexpr std::size_t kWakeBytes = 2u << 20;  // (or a quarter of the buffer, if that is less)
constexpr std::int64_t kCallsPerBatch = 1024;  // calls in one row of `batches` at most
constexpr std::size_t kMaxOpenBatches = 4096;  // batches built at once (then written)
constexpr std::size_t kMaxCachedNames = 100'000;

}  // namespace

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

/// The writer thread's side: the database, the JSON lines file, the names it has seen.
class AuditLog::Writer {
 public:
  explicit Writer(const AuditOptions& options) : options_(options) {
    if (!options_.db_path.empty()) open_db();
    if (!options_.jsonl_path.empty()) open_jsonl();
    if (db_.is_open()) take_in_pending();
  }
  ~Writer() {
    if (db_.is_open()) {
      try {
        prune();  // the bounds hold when the store is left, too
      } catch (const sql::Error& e) {
        complain(std::string("audit store ") + options_.db_path + ": " + e.what());
      }
    }
    if (jsonl_ >= 0) ::close(jsonl_);
  }

  /// Writes the records in `chunks` (each a run of RecordHead + bytes) in one transaction;
  /// returns how many, and in `ok` whether all of them were written.
  /// `ticks` turns the ticks the records were stamped with into the steady clock.
  std::size_t write(const std::vector<const AuditBytes*>& chunks, const TickLine& ticks, bool& ok) {
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
      // one and compared as a word stalled the loop).
      Call calls[2];
      for (const auto* chunk : chunks) {
        const char* p = chunk->data();
        const char* end = p + chunk->size;
        while (p < end) {
          Call& c = calls[total & 1];
          const Call& prev = calls[(total + 1) & 1];
          std::memcpy(&c.head, p, sizeof c.head);
          p += sizeof c.head;
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

  /// A write of its own (nothing was waiting): whether the store can record again. The
  /// database gets a row of `meta` rewritten; the JSON lines file gets room for a pass's
  /// lines, taken and given back.
  bool probe() {
    try {
      if (db_.is_open()) {
        sql::Transaction tx(db_);
        probe_.bind(1, audit_iso_time(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          std::chrono::system_clock::now().time_since_epoch())
                                          .count()))
            .run();
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

  static std::size_t count_records(const AuditBytes& chunk) {
    std::size_t n = 0;
    for (const char* p = chunk.data(); p < chunk.data() + chunk.size; ++n) {
      RecordHead h;
      std::memcpy(&h, p, sizeof h);
      p += sizeof h + h.aid_len + h.user_len + h.input_len;
    }
    return n;
  }

  /// Takes the records of the pending file into the database (in one transaction), then
  /// empties the file. Writers of the file hold a shared lock on it for each append.
  void take_in_pending() {
    const std::string path = options_.db_path + "-pending";
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return;
    (void)::fchmod(fd, 0600);
    ::flock(fd, LOCK_EX);
    AuditBytes chunk;
    struct stat st {};
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
      while (whole + sizeof(RecordHead) <= chunk.size) {
        RecordHead h;
        std::memcpy(&h, chunk.data() + whole, sizeof h);
        const std::size_t len = sizeof h + std::size_t{h.aid_len} + h.user_len + h.input_len;
        if ((h.flags & kUnix) == 0 || h.aid_len > kAuditMaxAid || h.input_len > kAuditMaxInput ||
            whole + len > chunk.size)
          break;
        whole += len;
      }
      chunk.size = whole;
      bool ok = true;
      if (whole > 0) write({&chunk}, TickLine({}, {}), ok);
      if (ok) (void)::ftruncate(fd, 0);
    }
    ::flock(fd, LOCK_UN);
    ::close(fd);
  }

 private:
  /// One record, read in place from a thread's buffer.
  struct Call {
    RecordHead head{};
    std::string_view aid, user, input;
    std::int64_t ts_ms = 0, duration_us = 0;

    bool same_but_input(const Call& o) const {
      return head.front == o.head.front && head.kind == o.head.kind && head.flags == o.head.flags && aid == o.aid &&
             user == o.user;
    }
    bool same_call(const Call& o) const { return same_but_input(o) && input == o.input; }
  };

  /// The calls of one shape in this pass, as the JSON text of a `batches` row.
  struct Batch {
    std::int64_t shape = 0, base_ms = 0, min_ms = 0, max_ms = 0;
    std::int64_t n = 0;
    std::string calls;  // "[[ts_ms - base_ms, duration_us, input_bytes, output_bytes], ..."
  };

  /// The digest of an input into args_/path_, remembered for short inputs seen again (in
  /// a table of fixed slots whose strings keep their memory: nothing is allocated once warm).
  void digest(std::string_view input, bool cut) {
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

  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  /// Ids of names (tools, users) and digests already in the database, bounded: past the
  /// bound the cache starts again (the tables keep everything).
  using Ids = std::unordered_map<std::string, std::int64_t, Hash, std::equal_to<>>;

  void open_db() {
    // Made (or kept) its owner's only before SQLite opens it: SQLite gives the WAL and
    // shared-memory files it makes the database file's mode.
    const int fd = open_owner_only(options_.db_path, O_RDWR);
    if (fd < 0) {
      throw HostError("audit store " + options_.db_path + ": cannot open it: " + std::strerror(errno));
    }
    ::close(fd);
    for (const char* suffix : {"-wal", "-shm", "-journal"}) (void)::chmod((options_.db_path + suffix).c_str(), 0600);
    try {
      db_ = sql::Db(options_.db_path);
      // Switching a new store to WAL needs it to itself: hosts starting together retry
      // (SQLite's busy handler does not cover this one), for as long as it would.
      for (int attempt = 0;; ++attempt) {
        try {
          db_.exec("PRAGMA journal_mode=WAL");
          break;
        } catch (const sql::Error&) {
          if (attempt >= 500) throw;
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      }
      db_.exec("PRAGMA synchronous=NORMAL");
      // A checkpoint (and its fsync) every MiB of log: what it copies is still in the cache,
      // and closing the store has little left to copy (measured: a little faster than 4 or 16).
      db_.exec("PRAGMA wal_autocheckpoint=256");
      // Set up in one write transaction: hosts starting together on one store take turns.
      sql::Transaction setup(db_);
      // What repeats (tool, front, user, status, the digest of its arguments) is stored
      // once, in tables of its own. The calls of one shape written together are one row of
      // `batches`, their numbers a JSON array; the views `calls` and `call_log` give a row
      // per call.
      db_.exec(
          "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
          "CREATE TABLE IF NOT EXISTS tools(id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);"
          "CREATE TABLE IF NOT EXISTS fronts(id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);"
          "CREATE TABLE IF NOT EXISTS users(id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);"
          "CREATE TABLE IF NOT EXISTS codes(id INTEGER PRIMARY KEY, code TEXT NOT NULL UNIQUE, status TEXT NOT NULL,"
          " error_type TEXT);"
          "CREATE TABLE IF NOT EXISTS args(id INTEGER PRIMARY KEY, digest TEXT NOT NULL UNIQUE, path TEXT);"
          // What a call was, but for its time and sizes (user 0: none).
          "CREATE TABLE IF NOT EXISTS shapes(id INTEGER PRIMARY KEY, tool INTEGER NOT NULL, front INTEGER NOT NULL,"
          " user INTEGER NOT NULL, code INTEGER NOT NULL, args INTEGER NOT NULL, idempotent_hit INTEGER NOT NULL,"
          " UNIQUE(tool, front, user, code, args, idempotent_hit));"
          "CREATE TABLE IF NOT EXISTS batches(id INTEGER PRIMARY KEY, first_call INTEGER NOT NULL,"
          " shape INTEGER NOT NULL, n INTEGER NOT NULL, base_ms INTEGER NOT NULL, min_ms INTEGER NOT NULL,"
          " max_ms INTEGER NOT NULL, calls TEXT NOT NULL);"
          // (Pruning asks which shapes no batch uses: without this index that read every
          // batch, a page each, ten times a million calls once the store was full.)
          "CREATE INDEX IF NOT EXISTS batches_by_shape ON batches(shape);"
          "CREATE VIEW IF NOT EXISTS calls AS SELECT b.first_call + j.key AS id,"
          " b.base_ms + json_extract(j.value, '$[0]') AS ts_ms, b.shape AS shape,"
          " json_extract(j.value, '$[1]') AS duration_us, json_extract(j.value, '$[2]') AS input_bytes,"
          " json_extract(j.value, '$[3]') AS output_bytes FROM batches b, json_each(b.calls) j;");
      db_.exec(std::string("CREATE VIEW IF NOT EXISTS call_log AS ") + kCallLogSelect);
      std::string held;
      {
        auto schema = db_.prepare("SELECT value FROM meta WHERE key = 'schema'");
        if (schema.step()) held = schema.text(0);
        schema.reset();  // (a statement left open would hold its read snapshot)
      }
      if (held == kAuditSchemaMigrated) {
        // Its calls stay as they are; its call_log view gains duration_ms.
        db_.exec(std::string("DROP VIEW call_log; CREATE VIEW call_log AS ") + kCallLogSelect);
        db_.prepare("UPDATE meta SET value = ? WHERE key = 'schema'").bind(1, kAuditSchema).run();
      } else if (held.empty()) {
        db_.prepare("INSERT INTO meta VALUES('schema', ?)").bind(1, kAuditSchema).run();
      } else if (held != kAuditSchema) {
        throw sql::Error("it holds '" + held + "', not '" + std::string(kAuditSchema) + "'");
      }
      probe_ = db_.prepare("INSERT OR REPLACE INTO meta VALUES('written', ?)");
      insert_batch_ = db_.prepare(
          "INSERT INTO batches(first_call, shape, n, base_ms, min_ms, max_ms, calls) VALUES(?, ?, ?, ?, ?, ?, ?)");
      last_batch_ = db_.prepare("SELECT first_call + n FROM batches ORDER BY id DESC LIMIT 1");
      for (const char* table : {"tools", "fronts", "users"}) {
        add_name_[table] = db_.prepare(std::string("INSERT OR IGNORE INTO ") + table + "(name) VALUES(?)");
        find_name_[table] = db_.prepare(std::string("SELECT id FROM ") + table + " WHERE name = ?");
      }
      add_args_ = db_.prepare("INSERT OR IGNORE INTO args(digest, path) VALUES(?, ?)");
      add_shape_ = db_.prepare(
          "INSERT OR IGNORE INTO shapes(tool, front, user, code, args, idempotent_hit) VALUES(?, ?, ?, ?, ?, ?)");
      find_shape_ = db_.prepare(
          "SELECT id FROM shapes WHERE tool = ? AND front = ? AND user = ? AND code = ? AND args = ? AND "
          "idempotent_hit = ?");
      find_args_ = db_.prepare("SELECT id FROM args WHERE digest = ?");
      auto add_code = db_.prepare("INSERT OR IGNORE INTO codes(code, status, error_type) VALUES(?, ?, ?)");
      add_code.bind(1, std::string_view("ok")).bind(2, std::string_view("OK")).bind_null(3).run();
      for (const auto& info : all_error_kinds()) {
        add_code.bind(1, std::string_view(info.code))
            .bind(2, status_name(info.status))
            .bind(3, error_type(info.kind))
            .run();
      }
      auto codes = db_.prepare("SELECT id, code FROM codes");
      std::unordered_map<std::string, std::int64_t> by_code;
      while (codes.step()) by_code[std::string(codes.text(1))] = codes.integer(0);
      codes.reset();
      code_by_kind_.assign(all_error_kinds().size() + 1, by_code.at("ok"));
      for (const auto& info : all_error_kinds()) {
        code_by_kind_.at(static_cast<std::size_t>(info.kind)) = by_code.at(std::string(info.code));
      }
      front_ids_.fill(-1);
      // Batches are appended in time order and their calls numbered on: the old ones are a
      // prefix. A batch goes once its newest call is older than the retention; past the
      // newest max_rows calls whole batches go, and the one across the line loses its
      // older calls. Shapes and digests no call refers to any more go after them.
      // (Each finds its line from the oldest batch on: in steady state it looks at one row.)
      expire_ = db_.prepare(
          "DELETE FROM batches WHERE id < coalesce((SELECT id FROM batches WHERE max_ms >= ?1 ORDER BY id LIMIT 1),"
          " (SELECT coalesce(max(id), 0) + 1 FROM batches))");
      drop_old_ = db_.prepare(
          "DELETE FROM batches WHERE id < coalesce((SELECT id FROM batches WHERE first_call + n > ?1 ORDER BY id"
          " LIMIT 1), (SELECT coalesce(max(id), 0) + 1 FROM batches))");
      trim_ = db_.prepare(
          "UPDATE batches SET calls = (SELECT json_group_array(json(j.value)) FROM json_each(batches.calls) j"
          " WHERE j.key >= ?1 - batches.first_call), n = n - (?1 - first_call), first_call = ?1"
          " WHERE id = (SELECT min(id) FROM batches) AND first_call < ?1");
      orphan_shapes_ = db_.prepare("DELETE FROM shapes WHERE id NOT IN (SELECT DISTINCT shape FROM batches)");
      orphan_args_ = db_.prepare("DELETE FROM args WHERE id NOT IN (SELECT DISTINCT args FROM shapes)");
      prune();
      setup.commit();
    } catch (const sql::Error& e) {
      throw HostError("audit store " + options_.db_path + ": " + e.what());
    }
  }

  void open_jsonl() {
    jsonl_ = open_owner_only(options_.jsonl_path, O_WRONLY | O_APPEND);
    if (jsonl_ < 0) {
      throw HostError("audit JSON lines file " + options_.jsonl_path + ": cannot be opened: " + std::strerror(errno));
    }
    struct stat st {};
    jsonl_bytes_ = ::fstat(jsonl_, &st) == 0 ? static_cast<std::uint64_t>(st.st_size) : 0;
  }

  void forget_ids() {
    args_ids_.clear();
    shape_ids_.clear();
    tool_ids_.clear();
    user_ids_.clear();
    front_names_.clear();
    front_ids_.fill(-1);
  }

  std::int64_t name_id(const char* table, Ids& cache, std::string_view name) {
    if (auto it = cache.find(name); it != cache.end()) return it->second;
    if (cache.size() >= kMaxCachedNames) cache.clear();
    add_name_[table].bind(1, name, true).run();
    auto& find = find_name_[table];
    find.bind(1, name, true);
    if (!find.step()) throw sql::Error(std::string("no id for a name in ") + table);
    const std::int64_t id = find.integer(0);
    find.reset();
    cache.emplace(name, id);
    return id;
  }

  std::int64_t args_id() {
    if (auto it = args_ids_.find(args_); it != args_ids_.end()) return it->second;
    if (args_ids_.size() >= kMaxCachedNames) args_ids_.clear();
    add_args_.bind(1, args_, true);
    if (path_.empty()) add_args_.bind_null(2);
    else add_args_.bind(2, path_, true);
    add_args_.run();
    find_args_.bind(1, args_, true);
    if (!find_args_.step()) throw sql::Error("no id for a digest");
    const std::int64_t id = find_args_.integer(0);
    find_args_.reset();
    args_ids_.emplace(args_, id);
    return id;
  }

  std::int64_t front_id(Front f) {
    std::int64_t& id = front_ids_.at(static_cast<std::size_t>(f));
    if (id < 0) id = name_id("fronts", front_names_, front_name(f));
    return id;
  }

  std::int64_t shape_id(const Call& c) {
    Shape key{name_id("tools", tool_ids_, c.aid), front_id(static_cast<Front>(c.head.front)),
              c.user.empty() ? 0 : name_id("users", user_ids_, c.user), code_by_kind_.at(c.head.kind), args_id(),
              (c.head.flags & kHit) != 0 ? 1 : 0};
    if (auto it = shape_ids_.find(key); it != shape_ids_.end()) return it->second;
    if (shape_ids_.size() >= kMaxCachedNames) shape_ids_.clear();
    for (auto* st : {&add_shape_, &find_shape_}) {
      st->bind(1, key.tool).bind(2, key.front).bind(3, key.user).bind(4, key.code).bind(5, key.args).bind(6, key.hit);
    }
    add_shape_.run();
    if (!find_shape_.step()) throw sql::Error("no id for a call's shape");
    const std::int64_t id = find_shape_.integer(0);
    find_shape_.reset();
    shape_ids_.emplace(key, id);
    return id;
  }

  /// The number the next call written gets (inside the write transaction: hosts sharing
  /// the store number on from each other).
  std::int64_t next_call_id() {
    const std::int64_t next = last_batch_.step() ? last_batch_.integer(0) : 1;
    last_batch_.reset();
    return next;
  }

  /// The open batch of a shape (a new one if it has none in this pass).
  std::size_t batch_for(std::int64_t shape) {
    if (const auto it = batch_of_shape_.find(shape); it != batch_of_shape_.end()) return it->second;
    if (open_batches_ >= kMaxOpenBatches) put_batches();  // (a pass of very many shapes)
    if (open_batches_ == batches_.size()) batches_.emplace_back();
    Batch& b = batches_[open_batches_];
    b.shape = shape;
    b.n = 0;
    batch_of_shape_.emplace(shape, open_batches_);
    return open_batches_++;
  }

  void add(Batch& b, const Call& c) {
    if (b.n == 0) {
      b.base_ms = b.min_ms = b.max_ms = c.ts_ms;
      b.calls.assign(1, '[');
    } else {
      b.calls += ',';
      b.min_ms = std::min(b.min_ms, c.ts_ms);
      b.max_ms = std::max(b.max_ms, c.ts_ms);
    }
    char text[96];
    char* p = text;
    *p++ = '[';
    for (const std::int64_t v : {c.ts_ms - b.base_ms, c.duration_us, static_cast<std::int64_t>(c.head.input_bytes),
                                 static_cast<std::int64_t>(c.head.output_bytes)}) {
      p = std::to_chars(p, text + sizeof text, v).ptr;
      *p++ = ',';
    }
    p[-1] = ']';
    b.calls.append(text, static_cast<std::size_t>(p - text));
    if (++b.n == kCallsPerBatch) put_batch(b);
  }

  void put_batch(Batch& b) {
    if (b.n == 0) return;
    b.calls += ']';
    insert_batch_.bind(1, next_call_)
        .bind(2, b.shape)
        .bind(3, b.n)
        .bind(4, b.base_ms)
        .bind(5, b.min_ms)
        .bind(6, b.max_ms)
        .bind(7, b.calls, true)
        .run();
    next_call_ += b.n;
    b.n = 0;
  }

  /// Writes every open batch, in the order their first calls came.
  void put_batches() {
    for (std::size_t i = 0; i < open_batches_; ++i) put_batch(batches_[i]);
    open_batches_ = 0;
    batch_of_shape_.clear();
  }

  void prune() {
    const std::int64_t cutoff =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count() -
        options_.retention_days * 86'400'000;
    expire_.bind(1, cutoff).run();
    std::int64_t changed = db_.changes();
    const std::int64_t keep_from = next_call_id() - options_.max_rows;
    if (keep_from > 1) {
      drop_old_.bind(1, keep_from).run();
      changed += db_.changes();
      trim_.bind(1, keep_from).run();
    }
    if (changed > 0) {
      orphan_shapes_.run();
      orphan_args_.run();
      shape_ids_.clear();
      args_ids_.clear();
    }
    since_prune_ = 0;
    last_prune_ = std::chrono::steady_clock::now();
  }

  /// Appends a call's line to jsonl_text_ (the file is rotated before it would grow past
  /// its bound).
  void jsonl_line(const Call& c) {
    std::string& line = jsonl_line_;
    line = "{\"time\":\"" + audit_iso_time(c.ts_ms) + "\",\"ts_ms\":" + std::to_string(c.ts_ms) + ",\"tool\":";
    append_json_string(line, c.aid);
    line += ",\"front\":\"" + std::string(front_name(static_cast<Front>(c.head.front))) + "\",\"user\":";
    if (c.user.empty()) line += "null";
    else append_json_string(line, c.user);
    const auto kind = static_cast<ErrorKind>(c.head.kind);
    const ErrorKindInfo& info = error_info(kind);
    line += ",\"status\":\"" + std::string(status_name(info.status)) + "\",\"code\":\"" +
            (kind == ErrorKind::none ? std::string("ok") : std::string(info.code)) + "\",\"error_type\":";
    if (kind == ErrorKind::none) line += "null";
    else append_json_string(line, error_type(kind));
    line += ",\"duration_us\":" + std::to_string(c.duration_us) + ",\"duration_ms\":" +
            std::to_string(c.duration_us / 1000) + "." + std::to_string(1000 + c.duration_us % 1000).substr(1) +
            ",\"input_bytes\":" +
            std::to_string(c.head.input_bytes) + ",\"output_bytes\":" + std::to_string(c.head.output_bytes) +
            ",\"idempotent_hit\":" + ((c.head.flags & kHit) != 0 ? "true" : "false") + ",\"path\":";
    if (path_.empty()) line += "null";
    else append_json_string(line, path_);
    line += ",\"args\":" + args_ + "}\n";
    std::string& out = jsonl_text_;
    if (jsonl_bytes_ + out.size() + line.size() > options_.jsonl_max_bytes && jsonl_bytes_ + out.size() > 0) {
      put_jsonl(out);
      rotate_jsonl();
    }
    if (jsonl_ >= 0) out += line;
  }

  /// Appends `text` (whole lines) to the JSON lines file. A write that fails leaves the file
  /// as it was (no part of a line), the lines lost and jsonl_failed_ set.
  void put_jsonl(std::string& text) {
    if (text.empty() || jsonl_ < 0) {
      text.clear();
      return;
    }
    std::size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(jsonl_, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = n < 0 ? errno : ENOSPC;
        if (done > 0) (void)::ftruncate(jsonl_, static_cast<off_t>(jsonl_bytes_));
        complain("audit JSON lines file " + options_.jsonl_path + ": " + std::strerror(err) + " (lines not recorded)");
        jsonl_failed_ = true;
        text.clear();
        return;
      }
      done += static_cast<std::size_t>(n);
    }
    jsonl_bytes_ += text.size();
    text.clear();
  }

  void rotate_jsonl() {
    ::close(jsonl_);
    std::rename(options_.jsonl_path.c_str(), (options_.jsonl_path + ".1").c_str());
    jsonl_ = open_owner_only(options_.jsonl_path, O_WRONLY | O_APPEND);
    jsonl_bytes_ = 0;
    if (jsonl_ < 0) {
      jsonl_failed_ = true;
      complain("audit JSON lines file " + options_.jsonl_path + ": cannot be opened again: " + std::strerror(errno));
    }
  }

  /// This process's OS user's name ("uid:N" when /etc/passwd names none), looked up once.
  /// The passwd file is read directly: a statically linked program cannot load the name
  /// service's other sources (getpwuid would try), and an audit record needs no more.
  std::string_view os_user() {
    if (os_user_.empty()) {
      const std::string uid = std::to_string(::geteuid());
      std::ifstream passwd("/etc/passwd");
      std::string line;
      while (os_user_.empty() && std::getline(passwd, line)) {
        // name:password:uid:gid:...
        const std::size_t name_end = line.find(':');
        const std::size_t uid_start = name_end == std::string::npos ? name_end : line.find(':', name_end + 1);
        const std::size_t uid_end = uid_start == std::string::npos ? uid_start : line.find(':', uid_start + 1);
        if (uid_end != std::string::npos && name_end > 0 && line.compare(uid_start + 1, uid_end - uid_start - 1, uid) == 0)
          os_user_ = line.substr(0, name_end);
      }
      if (os_user_.empty()) os_user_ = "uid:" + uid;
    }
    return os_user_;
  }

  void complain(const std::string& what) {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_complaint_ < std::chrono::minutes(1)) return;
    last_complaint_ = now;
    std::fprintf(stderr, "machina-toolhost: %s\n", what.c_str());
  }

  const AuditOptions& options_;
  sql::Db db_;
  sql::Stmt probe_, insert_batch_, last_batch_, expire_, drop_old_, trim_, orphan_shapes_, orphan_args_, add_args_,
      find_args_, add_shape_, find_shape_;
  struct Shape {
    std::int64_t tool, front, user, code, args, hit;
    bool operator==(const Shape&) const = default;
  };
  struct ShapeHash {
    std::size_t operator()(const Shape& k) const noexcept {
      std::uint64_t h = 0x9e3779b97f4a7c15ULL;
      for (std::int64_t v : {k.tool, k.front, k.user, k.code, k.args, k.hit}) {
        h = (h ^ static_cast<std::uint64_t>(v)) * 0x100000001b3ULL;
      }
      return static_cast<std::size_t>(h ^ (h >> 29));
    }
  };
  std::unordered_map<Shape, std::int64_t, ShapeHash> shape_ids_;
  std::unordered_map<std::string, sql::Stmt> add_name_, find_name_;
  Ids tool_ids_, user_ids_, front_names_, args_ids_;
  static constexpr std::size_t kMaxCachedInput = 256;
  struct DigestSlot {
    bool used = false;
    std::string input, args, path;
  };
  std::vector<DigestSlot> digests_ = std::vector<DigestSlot>(4096);
  std::string args_, path_;  // the digest of the current call's input, and its path
  std::string shape_args_;   // the digest batch_'s shape was found for
  std::array<std::int64_t, 8> front_ids_{};
  std::vector<std::int64_t> code_by_kind_;  // codes.id by ErrorKind
  std::vector<Batch> batches_;              // [0, open_batches_) are open (the rest keep their memory)
  std::size_t open_batches_ = 0, batch_ = 0;
  std::unordered_map<std::int64_t, std::size_t> batch_of_shape_;
  std::int64_t next_call_ = 1;
  std::string jsonl_text_, jsonl_line_;
  std::size_t since_prune_ = 0;
  std::chrono::steady_clock::time_point last_prune_{}, last_complaint_{};
  int jsonl_ = -1;  // the JSON lines file
  bool jsonl_failed_ = false;  // a write to it failed in this pass
  std::uint64_t jsonl_bytes_ = 0;
  std::string os_user_;
};

AuditLog::AuditLog(AuditOptions options)
    : options_(std::move(options)),
      tsc_(!options_.pending && clock_runs_on_tsc()),
      id_(next_log_id.fetch_add(1)) {
  if (options_.retention_days < 1) throw HostError("the audit retention must be at least 1 day");
  if (options_.max_rows < 1) throw HostError("the audit store must keep at least 1 call");
  if (options_.buffer_bytes < 64 * 1024) throw HostError("the audit buffer must be at least 64 KiB");
  if (options_.pending && !options_.db_path.empty() && options_.jsonl_path.empty()) {
    const std::string path = options_.db_path + "-pending";
    pending_fd_ = open_owner_only(path, O_WRONLY | O_APPEND | O_NOFOLLOW);
    if (pending_fd_ < 0) throw HostError("audit store " + path + ": cannot open it: " + std::strerror(errno));
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

void AuditLog::take_in_pending(const AuditOptions& options) {
  AuditOptions o = options;
  o.pending = false;
  o.jsonl_path.clear();
  Writer taker(o);  // (opening the database takes the pending file in)
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

bool AuditLog::append_pending(const AuditCall& call) {
  const std::int64_t offset_ns = realtime_minus_steady_ns();
  const std::int64_t ended_ns = call.ended_ns != 0 ? call.ended_ns : call.ended_ticks;  // (ticks are ns here)
  const auto aid = call.aid.substr(0, kAuditMaxAid), user = call.user.substr(0, 256);
  const auto input = call.input_json.substr(0, kAuditMaxInput);
  RecordHead head{};
  head.aid_len = static_cast<std::uint32_t>(aid.size());
  head.user_len = static_cast<std::uint32_t>(user.size());
  head.input_len = static_cast<std::uint32_t>(input.size());
  head.front = static_cast<std::uint8_t>(call.front);
  head.flags = static_cast<std::uint8_t>(kUnix | (call.idempotent_hit ? kHit : 0) |
                                         (call.input_json.size() > kAuditMaxInput ? kCut : 0) |
                                         (call.os_user ? kOsUser : 0));
  head.kind = static_cast<std::uint16_t>(call.kind);
  head.started_ns = call.started_ns + offset_ns;
  head.ended = ended_ns + offset_ns;
  head.input_bytes = call.input_json.size();
  head.output_bytes = call.output_bytes;
  std::string record(reinterpret_cast<const char*>(&head), sizeof head);
  record.append(aid).append(user).append(input);
  // One write under a shared lock: whoever takes the file in holds it exclusively.
  ::flock(pending_fd_, LOCK_SH);
  std::size_t done = 0;
  while (done < record.size()) {
    const ssize_t n = ::write(pending_fd_, record.data() + done, record.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  ::flock(pending_fd_, LOCK_UN);
  if (done != record.size()) {
    std::fprintf(stderr, "machina-toolhost: audit store %s-pending: %s (a call not recorded)\n",
                 options_.db_path.c_str(), std::strerror(done < record.size() && errno != 0 ? errno : ENOSPC));
    healthy_.store(false);
    return false;
  }
  healthy_.store(true);
  // A pending file that has grown is taken in by the process that finds it so.
  struct stat st {};
  if (::fstat(pending_fd_, &st) == 0 && static_cast<std::uint64_t>(st.st_size) >= kAuditPendingImportBytes) {
    try {
      take_in_pending(options_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "machina-toolhost: %s\n", e.what());
    }
  }
  return true;
}

namespace {
// The buffer this thread used last, and its log's id (plain values: no guard on access).
thread_local std::uint64_t last_id = 0;
thread_local AuditLog::Buffer* last = nullptr;
}  // namespace

AuditLog::Buffer& AuditLog::buffer_of_this_thread() {
  // The last buffer this thread used, then the thread's buffers by log. An entry whose log
  // has gone (the log no longer shares its buffer) is dropped when the list grows.
  if (last_id == id_) [[likely]] return *last;
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
/// a head built aside and copied whole stalled on its own narrow stores).
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
  const std::size_t need = sizeof(RecordHead) + aid_len + user_len + input_len;
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
  // Past kWakeBytes the writer is woken rather than left to its next round. (Woken at a
  // quarter of a MiB, at two million calls a second of ~90-byte records — every ~1.4 ms
  // against its 5 ms round —, the writer's extra transactions slowed the calling thread on
  // the other CPU: file-fed echo kept 0.89× of its throughput, 0.92× now, 15 runs each.)
  const std::size_t wake_at = std::min(kWakeBytes, options_.buffer_bytes / 4);
  const bool wake = b.data.size < wake_at && b.data.size + need >= wake_at;
  char* p = b.data.p.get() + b.data.size;
  put(p, offsetof(RecordHead, aid_len), aid_len);
  put(p, offsetof(RecordHead, user_len), user_len);
  put(p, offsetof(RecordHead, input_len), input_len);
  put(p, offsetof(RecordHead, front), static_cast<std::uint8_t>(call.front));
  put(p, offsetof(RecordHead, flags),
      static_cast<std::uint8_t>((call.idempotent_hit ? kHit : 0) | (call.input_json.size() > kAuditMaxInput ? kCut : 0) |
                                (call.ended_ns == 0 ? kTicks : 0) | (call.os_user ? kOsUser : 0)));
  put(p, offsetof(RecordHead, kind), static_cast<std::uint16_t>(call.kind));
  put(p, offsetof(RecordHead, started_ns), call.started_ns);
  put(p, offsetof(RecordHead, ended), call.ended_ns != 0 ? call.ended_ns : call.ended_ticks);
  put(p, offsetof(RecordHead, input_bytes), static_cast<std::uint64_t>(call.input_json.size()));
  put(p, offsetof(RecordHead, output_bytes), static_cast<std::uint64_t>(call.output_bytes));
  p += sizeof(RecordHead);
  // An empty view may hold a null pointer, which memcpy must not be given even for 0 bytes.
  const std::string_view parts[] = {call.aid.substr(0, aid_len), call.user.substr(0, user_len),
                                    call.input_json.substr(0, input_len)};
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

AuditRequired parse_audit_required(std::string_view text) {
  if (text == "none") return AuditRequired::none;
  if (text == "leased") return AuditRequired::leased;
  if (text == "all") return AuditRequired::all;
  throw HostError("the audit requirement must be none, leased or all, not '" + std::string(text) + "'");
}

void AuditLog::flush() {
  if (pending_fd_ >= 0) return;  // (each call is written as it is recorded)
  std::unique_lock lock(mu_);
  const std::uint64_t target = ++flush_asked_;
  wake_.notify_all();
  flushed_.wait(lock, [&] { return flush_done_ >= target; });
}

AuditLog::TickLine::TickLine(TickPoint from, TickPoint now) : to(now) {
  // (Readings without a span between them — or ticks that are nanoseconds already —:
  // a tick counts as a nanosecond.)
  if (to.ticks > from.ticks) {
    ns_per_tick = static_cast<double>(to.ns - from.ns) / static_cast<double>(to.ticks - from.ticks);
  }
}

AuditLog::TickPoint AuditLog::tick_point() const {
  if (!tsc_) {
    const std::int64_t ns = steady_ns();
    return {ns, ns};
  }
  // The counter read on both sides of the clock: the midpoint is within a few ns of it —
  // unless the thread was preempted in between, so the closest of three readings is kept
  // (one reading off by the length of a preemption would tilt the line for a whole pass).
  TickPoint best;
  std::int64_t best_gap = INT64_MAX;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const std::int64_t before = ticks();
    const std::int64_t ns = steady_ns();
    const std::int64_t after = ticks();
    if (after - before < best_gap) {
      best_gap = after - before;
      best = {before + (after - before) / 2, ns};
    }
  }
  return best;
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
