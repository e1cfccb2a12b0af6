// See code_index.hpp. The files of a root are those code.grep searches: ripgrep lists them
// (`rg --files`: .gitignore respected, hidden files skipped, links not followed, the
// policy's denied names and files over max_file_bytes left out), each is checked again by
// name and opened beneath the root's descriptor following no link (a regular file with a
// single link, not the lease key); one with a NUL byte is binary and never indexed.
//
// The database (index_dir/<hash>.sqlite, the hash of the root and of the policy's file
// rules, so hosts with other rules never share an index): `files` (path, size, mtime in
// ns, inode, binary) and the FTS5 table `chunks` (text, identifier parts, first line, line
// count), a chunk's rowid being its file's id << 20 | its number, so a file's chunks are
// one rowid range. WAL, so searches read while another refreshes; the refresh holds an
// flock on index_dir/<hash>.lock (one at a time, across threads and processes) and
// commits in batches, so a refresh cut by its deadline keeps what it did.
#include "code_index.hpp"

#include "child_records.hpp"

#include <machina/child_process.hpp>
#include <machina/clock.hpp>
#include <machina/code_search_text.hpp>
#include <machina/json_text.hpp>
#include <machina/sha256_hex.hpp>
#include <machina/workspace.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>
#include <unordered_map>

namespace machina::packs {
namespace {

constexpr int kChunkBits = 20;                     // chunks of a file: rowids id << 20 | 0 .. 2^20 - 1
constexpr std::uint64_t kBatchFiles = 256;         // files written per transaction
constexpr std::uint64_t kBatchBytes = 8u << 20;    // bytes written per transaction
constexpr std::size_t kMaxListingLine = 1u << 16;  // a name rg lists, at most (longer: dropped)

/// The index's name: what decides which files it may hold (the root, the file rules, the
/// protected files, the layout's version), hashed.
std::string index_name(const Policy& policy, const std::string& root) {
  std::string key = "machina code index 1\n";
  key.append(root).append("\n").append(std::to_string(policy.code.max_file_bytes)).append("\n");
  for (const auto& g : policy.files.deny) key.append(g).append("\n");
  for (const auto& [dev, ino] : policy.protected_files) {
    key.append(std::to_string(dev)).append(":").append(std::to_string(ino)).append("\n");
  }
  return sha256_hex({key}, 16);
}

/// The index folder, made if missing (0700); refused unless it is a directory of this
/// user's that nobody else may write to (an index planted there would answer searches).
bool index_dir_ready(const std::string& dir, std::string& why) {
  std::error_code ec;
  const std::filesystem::path p(dir);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    why = "cannot make the index folder " + dir + ": " + std::strerror(errno);
    return false;
  }
  struct stat st{};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    why = "the index folder " + dir + " is not a directory";
    return false;
  }
  if (st.st_uid != ::geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    why = "the index folder " + dir + " is not this user's alone (owned by another, or writable by others)";
    return false;
  }
  return true;
}

/// The bytes of a name rg listed, beneath the listed directory.
bool relative(std::string_view listed, std::string_view prefix, std::string& rel) {
  if (listed.size() <= prefix.size() || listed.compare(0, prefix.size(), prefix) != 0) return false;
  rel.assign(listed.substr(prefix.size()));
  return true;
}

Result timed_out(std::int64_t started, std::int64_t deadline, const char* doing) {
  std::string why = "the search ran past ";
  why.append(std::to_string(std::max<std::int64_t>(deadline - started, 0))).append(" ms (").append(doing).append(")");
  return Result::stopped(RunOutcome::Ending::timed_out, std::move(why));
}

}  // namespace

/// What stops a call: its deadline, its caller's cancellation. SQLite's progress handler
/// reads it while a search runs.
struct CodeIndex::Stop {
  std::int64_t started = 0;
  std::int64_t deadline = 0;
  CancelToken* cancel = nullptr;
  bool armed = false;  // SQLite may be interrupted (not while committing)
  bool hit = false;
  bool now() const { return steady_now_ms() >= deadline || (cancel != nullptr && cancel->cancelled()); }
  Result result(const char* doing) const {
    if (cancel != nullptr && cancel->cancelled()) return Result::stopped(RunOutcome::Ending::cancelled);
    return timed_out(started, deadline, doing);
  }
  static int on_progress(void* p) {
    auto* s = static_cast<Stop*>(p);
    if (s->armed && s->now()) s->hit = true;
    return s->hit ? 1 : 0;
  }
};

CodeIndex::CodeIndex() : stop_(std::make_unique<Stop>()) {}
CodeIndex::~CodeIndex() = default;
CodeIndex::CodeIndex(CodeIndex&&) noexcept = default;
CodeIndex& CodeIndex::operator=(CodeIndex&&) noexcept = default;

bool CodeIndex::stopped() const {
  return stop_->hit;
}

Result CodeIndex::open_fresh(const Call& c, const std::string& root, const std::string& rg, IndexCounts& counts) {
  Stop& stop = *stop_;
  stop.started = steady_now_ms();
  stop.deadline = c.spec.deadline_ms;
  stop.cancel = c.spec.cancel;
  const Policy& policy = c.policy;
  const std::string& dir = policy.code.index_dir;
  std::string why;
  if (!index_dir_ready(dir, why)) return system_error(why);
  const std::string base = dir + "/" + index_name(policy, root);

  // One refresh at a time: the lock, waited for until the deadline.
  workspace::Fd lock(::open((base + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!lock) return system_error("cannot open " + base + ".lock: " + std::strerror(errno));
  while (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR)
      return system_error("cannot lock " + base + ".lock: " + std::strerror(errno));
    if (stop.now()) return stop.result("waiting for another search's refresh of the index");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }

  // The database, made on first use (and made again if it is not one).
  auto setup = [&] {
    db_ = sql::Db(base + ".sqlite");
    sqlite3_progress_handler(db_.handle(), 1000, &Stop::on_progress, stop_.get());
    db_.exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;");
    db_.exec(
        "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "CREATE TABLE IF NOT EXISTS files(id INTEGER PRIMARY KEY, path TEXT NOT NULL UNIQUE, size INTEGER NOT NULL,"
        " mtime_ns INTEGER NOT NULL, ino INTEGER NOT NULL, binary INTEGER NOT NULL);"
        "CREATE VIRTUAL TABLE IF NOT EXISTS chunks USING fts5(text, idents, first_line UNINDEXED, lines UNINDEXED,"
        " tokenize = 'porter unicode61');");
    db_.prepare("INSERT OR IGNORE INTO meta(key, value) VALUES('root', ?1)").bind(1, root).run();
    auto st = db_.prepare("SELECT value FROM meta WHERE key = 'root'");
    if (!st.step() || st.text(0) != root) throw sql::Error("the index " + base + ".sqlite belongs to another root");
  };
  try {
    try {
      setup();
    } catch (const sql::Error& e) {
      const std::string what = e.what();
      if (what.find("malformed") == std::string::npos && what.find("not a database") == std::string::npos) throw;
      db_ = sql::Db();
      for (const char* ext : {".sqlite", ".sqlite-wal", ".sqlite-shm"}) ::unlink((base + ext).c_str());
      setup();
    }
  } catch (const sql::Error& e) {
    return system_error(std::string("the search index: ") + e.what());
  }

  // What ripgrep lists: the first max_index_files names, in order of their paths.
  workspace::Workspace ws;
  if (!ws.open(root, why)) return missing(why);
  workspace::Fd listed;
  if (workspace::Fd d = ws.open_dir({}, why))
    listed = workspace::Fd(::openat(d.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!listed) return system_error(root + ": " + (why.empty() ? std::strerror(errno) : why));
  const ChildSpec child = rg_child(rg, policy, {"--files", "--null"}, listed.get());
  Result not_started;
  const std::unique_ptr<ChildProcess> proc = start_rg(child, c.spawner, not_started);
  if (!proc) return not_started;
  std::vector<std::string> names;
  const std::uint64_t cap = policy.code.max_index_files;
  {
    const std::string_view prefix = kRgSearchedPrefix;
    std::string rel;
    const RecordsEnd end = read_records(
        *proc, '\0', kMaxListingLine, stop.deadline, 100, [&] { return stop.now(); },
        [&](std::string_view name) {
          if (!relative(name, prefix, rel)) return true;
          if (names.size() >= cap) {
            counts.more_files = true;
            return false;
          }
          names.push_back(rel);
          return true;
        });
    if (end == RecordsEnd::timed_out || (end == RecordsEnd::stopped && !counts.more_files)) {
      proc->kill();
      proc->end(100);
      return stop.result("listing the files");
    }
    if (counts.more_files) proc->kill();
    proc->end(100);
    // rg: 0 files listed, 1 none, 2 an error (an unreadable folder alone still lists the rest).
    if (!counts.more_files && proc->exit_code() == 2 && names.empty()) {
      return system_error("ripgrep could not list the files: " + std::string(code_search::cut_utf8(proc->tail(), 500)));
    }
  }

  // The index as it is.
  struct Row {
    std::int64_t id = 0, size = 0, mtime_ns = 0, ino = 0;
    bool binary = false, seen = false;
  };
  std::unordered_map<std::string, Row> rows;
  std::uint64_t total = 0;  // bytes of the text files indexed
  try {
    auto st = db_.prepare("SELECT id, path, size, mtime_ns, ino, binary FROM files");
    while (st.step()) {
      Row r{st.integer(0), st.integer(2), st.integer(3), st.integer(4), st.integer(5) != 0, false};
      if (!r.binary) total += static_cast<std::uint64_t>(r.size);
      rows.emplace(std::string(st.text(1)), r);
    }
  } catch (const sql::Error& e) {
    return system_error(std::string("the search index: ") + e.what());
  }

  // New and changed files read and indexed, in batches of a transaction each.
  std::optional<sql::Transaction> tx;
  std::uint64_t batch_files = 0, batch_bytes = 0, read_here = 0;
  Result stopped_by;
  try {
    auto put_file = db_.prepare("INSERT INTO files(path, size, mtime_ns, ino, binary) VALUES(?1, ?2, ?3, ?4, ?5)");
    auto set_file = db_.prepare("UPDATE files SET size = ?2, mtime_ns = ?3, ino = ?4, binary = ?5 WHERE id = ?1");
    auto drop_chunks = db_.prepare("DELETE FROM chunks WHERE rowid BETWEEN ?1 AND ?2");
    auto put_chunk =
        db_.prepare("INSERT INTO chunks(rowid, text, idents, first_line, lines) VALUES(?1, ?2, ?3, ?4, ?5)");
    auto drop_file = db_.prepare("DELETE FROM files WHERE id = ?1");
    auto commit = [&] {
      if (tx) tx->commit();
      tx.reset();
      batch_files = batch_bytes = 0;
    };
    auto chunks_of = [](std::int64_t id, std::int64_t& low, std::int64_t& high) {
      low = id << kChunkBits;
      high = low | ((std::int64_t{1} << kChunkBits) - 1);
    };
    std::vector<std::string> parts;
    std::string content;
    for (const auto& name : names) {
      if (stop.now()) {
        stopped_by = stop.result("indexing the files");
        break;
      }
      std::string refused;
      if (!workspace::split(name, parts, refused) || denied_by_name(policy, parts)) {
        ++counts.skipped;
        continue;
      }
      workspace::Fd fd = ws.open_for_reading(parts, refused);
      struct stat st{};
      if (!fd || ::fstat(fd.get(), &st) != 0 || policy.is_protected(st.st_dev, st.st_ino) ||
          static_cast<std::uint64_t>(st.st_size) > policy.code.max_file_bytes) {
        ++counts.skipped;
        continue;
      }
      const std::int64_t size = st.st_size;
      const std::int64_t mtime_ns = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
      const auto ino = static_cast<std::int64_t>(st.st_ino);
      auto row = rows.find(name);
      Row* old = row == rows.end() ? nullptr : &row->second;
      if (old != nullptr) old->seen = true;
      if (old != nullptr && old->size == size && old->mtime_ns == mtime_ns && old->ino == ino) {
        ++counts.unchanged;
        continue;
      }
      const std::uint64_t kept = old != nullptr && !old->binary ? static_cast<std::uint64_t>(old->size) : 0;
      if (total - kept + static_cast<std::uint64_t>(size) > policy.code.max_index_bytes) {
        ++counts.over_cap;  // (an older version stays until there is room)
        continue;
      }
      if (read_here > 0 && read_here + static_cast<std::uint64_t>(size) > policy.code.max_refresh_bytes) {
        ++counts.pending;
        continue;
      }
      // Read whole (a file that grew past the limit meanwhile is left out).
      content.assign(static_cast<std::size_t>(size) + 1, '\0');
      std::size_t got = 0;
      bool failed = false;
      while (got < content.size()) {
        const ssize_t n = ::read(fd.get(), content.data() + got, content.size() - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) failed = true;
        if (n <= 0) break;
        got += static_cast<std::size_t>(n);
      }
      fd = workspace::Fd();
      if (failed || got > static_cast<std::size_t>(size)) {
        if (old != nullptr) old->seen = false;  // dropped below
        ++counts.skipped;
        continue;
      }
      content.resize(got);
      read_here += got;
      counts.bytes_read += got;
      const bool binary = std::memchr(content.data(), '\0', content.size()) != nullptr;
      if (!binary && !is_valid_utf8(content)) content = to_valid_utf8(content);
      if (!tx) tx.emplace(db_);
      std::int64_t id = 0;
      if (old != nullptr) {
        id = old->id;
        std::int64_t low = 0, high = 0;
        chunks_of(id, low, high);
        drop_chunks.bind(1, low).bind(2, high).run();
        set_file.bind(1, id).bind(2, size).bind(3, mtime_ns).bind(4, ino).bind(5, std::int64_t{binary}).run();
        total -= kept;
        old->size = size;
        old->mtime_ns = mtime_ns;
        old->ino = ino;
        old->binary = binary;
      } else {
        put_file.bind(1, name).bind(2, size).bind(3, mtime_ns).bind(4, ino).bind(5, std::int64_t{binary}).run();
        id = db_.last_insert_rowid();
        rows.emplace(name, Row{id, size, mtime_ns, ino, binary, true});
      }
      if (binary) {
        ++counts.skipped;
      } else {
        total += static_cast<std::uint64_t>(size);
        ++counts.indexed;
        std::int64_t number = 0;
        for (const auto& ch : code_search::chunk_text(content)) {
          if (number >> kChunkBits) break;  // (a file of over 30 million lines: its start is indexed)
          put_chunk.bind(1, (id << kChunkBits) | number++)
              .bind(2, ch.text, true)
              .bind(3, ch.idents, true)
              .bind(4, static_cast<std::int64_t>(ch.first_line))
              .bind(5, static_cast<std::int64_t>(ch.lines))
              .run();
        }
      }
      ++batch_files;
      batch_bytes += got;
      if (batch_files >= kBatchFiles || batch_bytes >= kBatchBytes) commit();
    }
    // Files no longer listed (or no longer readable) leave the index; not after a listing
    // cut short, which would drop what it did not get to.
    if (ok(stopped_by)) {
      for (auto& [path, r] : rows) {
        if (r.seen) continue;
        if (!tx) tx.emplace(db_);
        std::int64_t low = 0, high = 0;
        chunks_of(r.id, low, high);
        drop_chunks.bind(1, low).bind(2, high).run();
        drop_file.bind(1, r.id).run();
        ++counts.removed;
        if (++batch_files >= kBatchFiles) commit();
      }
    }
    commit();
    auto count = db_.prepare("SELECT count(*) FROM files WHERE binary = 0");
    if (count.step()) counts.files += static_cast<std::uint64_t>(count.integer(0));
  } catch (const sql::Error& e) {
    return system_error(std::string("the search index: ") + e.what());
  }
  return stopped_by;
}

std::vector<Hit> CodeIndex::search(const std::string& match, std::size_t limit, std::size_t which) {
  stop_->armed = true;
  std::vector<Hit> hits;
  auto st = db_.prepare("SELECT rowid, bm25(chunks, 1.0, 0.5) FROM chunks WHERE chunks MATCH ?1 ORDER BY 2 LIMIT ?2");
  st.bind(1, match, true).bind(2, static_cast<std::int64_t>(limit));
  while (st.step()) {
    Hit h;
    h.rowid = st.integer(0);
    h.bm25 = st.real(1);
    h.index = which;
    hits.push_back(std::move(h));
  }
  return hits;
}

bool CodeIndex::describe(Hit& hit, const std::string& match) {
  stop_->armed = true;
  auto st = db_.prepare(
      "SELECT highlight(chunks, 0, char(1), char(2)), highlight(chunks, 1, char(1), char(2)), first_line, lines, text"
      " FROM chunks WHERE chunks MATCH ?1 AND rowid = ?2");
  st.bind(1, match, true).bind(2, hit.rowid);
  if (!st.step()) return false;
  const std::size_t best = code_search::best_line(st.text(0), st.text(1));
  hit.first_line = st.integer(2);
  hit.last_line = hit.first_line + st.integer(3) - 1;
  hit.line = hit.first_line + static_cast<std::int64_t>(best);
  hit.snippet = code_search::snippet(st.text(4), best);
  auto path = db_.prepare("SELECT path FROM files WHERE id = ?1");
  path.bind(1, hit.rowid >> kChunkBits);
  if (!path.step()) return false;
  hit.path = std::string(path.text(0));
  return true;
}

}  // namespace machina::packs
