// The audit store's SQLite database: its schema (made, checked, migrated), the ids of the
// names, digests and shapes it holds, the `batches` rows a pass writes, and the retention
// bounds (prune).

#include "audit_writer.hpp"

#include <machina/clock.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstring>
#include <thread>

namespace machina {

using namespace audit_detail;

namespace {

/// The view of a row per call with its names, as `SELECT ...` (docs/tool-packs.md).
constexpr const char* kCallLogSelect =
    "SELECT c.id, c.ts_ms, strftime('%Y-%m-%dT%H:%M:%fZ', c.ts_ms / 1000.0, 'unixepoch') AS time,"
    " t.name AS tool, f.name AS front, u.name AS user, k.status, k.code, k.error_type, c.duration_us,"
    " c.duration_us / 1000.0 AS duration_ms, c.input_bytes, c.output_bytes, s.idempotent_hit, a.path,"
    " a.digest AS args FROM calls c JOIN shapes s ON s.id = c.shape JOIN tools t ON t.id = s.tool"
    " JOIN fronts f ON f.id = s.front LEFT JOIN users u ON u.id = s.user JOIN codes k ON k.id = s.code"
    " JOIN args a ON a.id = s.args";

constexpr std::int64_t kCallsPerBatch = 1024;  // calls in one row of `batches` at most
constexpr std::size_t kMaxOpenBatches = 4096;  // batches built at once (then written)
constexpr std::size_t kMaxCachedNames = 100'000;

}  // namespace

void AuditLog::Writer::open_db() {
  // Made (or kept) its owner's only before SQLite opens it: SQLite gives the WAL and
  // shared-memory files it makes the database file's mode.
  const int fd = open_owner_only(options_.db_path, O_RDWR);
  if (fd < 0) {
    throw ConfigError("audit store " + options_.db_path + ": cannot open it: " + std::strerror(errno));
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
    // and closing the store has little left to copy.
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
        // (Pruning asks which shapes no batch uses: without this index it reads every
        // batch, a page each, once the store is full.)
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
    throw ConfigError("audit store " + options_.db_path + ": " + e.what());
  }
}

void AuditLog::Writer::forget_ids() {
  args_ids_.clear();
  shape_ids_.clear();
  tool_ids_.clear();
  user_ids_.clear();
  front_ids_.clear();
}

std::int64_t AuditLog::Writer::name_id(const char* table, Ids& cache, std::string_view name) {
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

std::int64_t AuditLog::Writer::args_id() {
  if (auto it = args_ids_.find(args_); it != args_ids_.end()) return it->second;
  if (args_ids_.size() >= kMaxCachedNames) args_ids_.clear();
  add_args_.bind(1, args_, true);
  if (path_.empty())
    add_args_.bind_null(2);
  else
    add_args_.bind(2, path_, true);
  add_args_.run();
  find_args_.bind(1, args_, true);
  if (!find_args_.step()) throw sql::Error("no id for a digest");
  const std::int64_t id = find_args_.integer(0);
  find_args_.reset();
  args_ids_.emplace(args_, id);
  return id;
}

std::int64_t AuditLog::Writer::shape_id(const Call& c) {
  Shape key{name_id("tools", tool_ids_, c.aid),
            name_id("fronts", front_ids_, c.front),
            c.user.empty() ? 0 : name_id("users", user_ids_, c.user),
            code_by_kind_.at(c.head.kind),
            args_id(),
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

std::int64_t AuditLog::Writer::next_call_id() {
  const std::int64_t next = last_batch_.step() ? last_batch_.integer(0) : 1;
  last_batch_.reset();
  return next;
}

std::size_t AuditLog::Writer::batch_for(std::int64_t shape) {
  if (const auto it = batch_of_shape_.find(shape); it != batch_of_shape_.end()) return it->second;
  if (open_batches_ >= kMaxOpenBatches) put_batches();  // (a pass of very many shapes)
  if (open_batches_ == batches_.size()) batches_.emplace_back();
  Batch& b = batches_[open_batches_];
  b.shape = shape;
  b.n = 0;
  batch_of_shape_.emplace(shape, open_batches_);
  return open_batches_++;
}

void AuditLog::Writer::add(Batch& b, const Call& c) {
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

void AuditLog::Writer::put_batch(Batch& b) {
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

void AuditLog::Writer::put_batches() {
  for (std::size_t i = 0; i < open_batches_; ++i) put_batch(batches_[i]);
  open_batches_ = 0;
  batch_of_shape_.clear();
}

void AuditLog::Writer::prune() {
  const std::int64_t cutoff = unix_now_ms() - options_.retention_days * 86'400'000;
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

}  // namespace machina
