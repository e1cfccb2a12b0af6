// See sqlite_db.hpp.
#include <machina/sqlite_db.hpp>

#include <sqlite3.h>

#include <utility>

namespace machina::sql {
namespace {
[[noreturn]] void fail(sqlite3* db, const std::string& what) {
  throw Error(what + ": " + (db != nullptr ? sqlite3_errmsg(db) : "out of memory"));
}
}  // namespace

Stmt::Stmt(sqlite3* db, std::string_view sql) : db_(db) {
  if (sqlite3_prepare_v3(db, sql.data(), static_cast<int>(sql.size()), SQLITE_PREPARE_PERSISTENT, &stmt_, nullptr) !=
      SQLITE_OK) {
    std::string what = "cannot prepare '";
    what.append(sql.substr(0, 80)).append("'");
    fail(db, what);
  }
}

Stmt::~Stmt() {
  sqlite3_finalize(stmt_);
}

Stmt::Stmt(Stmt&& other) noexcept : db_(other.db_), stmt_(std::exchange(other.stmt_, nullptr)) {}

Stmt& Stmt::operator=(Stmt&& other) noexcept {
  if (this != &other) {
    sqlite3_finalize(stmt_);
    db_ = other.db_;
    stmt_ = std::exchange(other.stmt_, nullptr);
  }
  return *this;
}

Stmt& Stmt::bind(int index, std::int64_t value) {
  if (sqlite3_bind_int64(stmt_, index, value) != SQLITE_OK) fail(db_, "cannot bind");
  return *this;
}

Stmt& Stmt::bind(int index, double value) {
  if (sqlite3_bind_double(stmt_, index, value) != SQLITE_OK) fail(db_, "cannot bind");
  return *this;
}

Stmt& Stmt::bind(int index, std::string_view text, bool stable) {
  if (sqlite3_bind_text64(stmt_, index, text.data(), text.size(), stable ? SQLITE_STATIC : SQLITE_TRANSIENT,
                          SQLITE_UTF8) != SQLITE_OK) {
    fail(db_, "cannot bind");
  }
  return *this;
}

Stmt& Stmt::bind_null(int index) {
  if (sqlite3_bind_null(stmt_, index) != SQLITE_OK) fail(db_, "cannot bind");
  return *this;
}

bool Stmt::step() {
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  std::string what = "'";
  what.append(std::string_view(sqlite3_sql(stmt_) != nullptr ? sqlite3_sql(stmt_) : "").substr(0, 80))
      .append("' failed");
  sqlite3_reset(stmt_);
  fail(db_, what);
}

void Stmt::run() {
  while (step()) {
  }
  reset();
}

void Stmt::reset() {
  sqlite3_reset(stmt_);
}

bool Stmt::is_null(int column) const {
  return sqlite3_column_type(stmt_, column) == SQLITE_NULL;
}

std::int64_t Stmt::integer(int column) const {
  return sqlite3_column_int64(stmt_, column);
}

double Stmt::real(int column) const {
  return sqlite3_column_double(stmt_, column);
}

std::string_view Stmt::text(int column) const {
  const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, column));
  if (p == nullptr) return {};
  return {p, static_cast<std::size_t>(sqlite3_column_bytes(stmt_, column))};
}

Db::Db(const std::string& path, bool create, bool read_only) {
  int flags = read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE;
  if (create && !read_only) flags |= SQLITE_OPEN_CREATE;
  flags |= SQLITE_OPEN_NOMUTEX;  // one connection per thread: the caller serialises its use
  if (sqlite3_open_v2(path.c_str(), &db_, flags, nullptr) != SQLITE_OK) {
    const std::string why = db_ != nullptr ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    db_ = nullptr;
    throw Error("cannot open " + path + ": " + why);
  }
  sqlite3_extended_result_codes(db_, 1);
  sqlite3_busy_timeout(db_, 5000);
}

Db::~Db() {
  sqlite3_close_v2(db_);
}

Db::Db(Db&& other) noexcept : db_(std::exchange(other.db_, nullptr)) {}

Db& Db::operator=(Db&& other) noexcept {
  if (this != &other) {
    sqlite3_close_v2(db_);
    db_ = std::exchange(other.db_, nullptr);
  }
  return *this;
}

void Db::exec(const std::string& sql) {
  char* message = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &message) != SQLITE_OK) {
    const std::string why = message != nullptr ? message : sqlite3_errmsg(db_);
    sqlite3_free(message);
    std::string what = "'";
    what.append(std::string_view(sql).substr(0, 80)).append("' failed: ").append(why);
    throw Error(what);
  }
}

std::int64_t Db::last_insert_rowid() const {
  return sqlite3_last_insert_rowid(db_);
}

std::int64_t Db::changes() const {
  return sqlite3_changes64(db_);
}

Transaction::Transaction(Db& db) : db_(db) {
  db_.exec("BEGIN IMMEDIATE");
}

Transaction::~Transaction() {
  if (!done_) {
    try {
      db_.exec("ROLLBACK");
    } catch (const Error&) {  // nothing to roll back (the transaction already ended)
    }
  }
}

void Transaction::commit() {
  db_.exec("COMMIT");
  done_ = true;
}

}  // namespace machina::sql
