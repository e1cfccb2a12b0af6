// A thin RAII layer over SQLite's C API (Debian: libsqlite3-dev): a connection and its
// prepared statements, every failure thrown as sql::Error with SQLite's own message. The
// audit store and code.search's index use it.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

struct sqlite3;
struct sqlite3_stmt;

namespace machina::sql {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Stmt {
 public:
  Stmt() = default;
  Stmt(sqlite3* db, std::string_view sql);
  ~Stmt();
  Stmt(Stmt&& other) noexcept;
  Stmt& operator=(Stmt&& other) noexcept;
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  // Parameters are numbered from 1. Text is copied unless `stable` says the caller keeps
  // it alive and unchanged until the statement is reset or stepped to its end.
  Stmt& bind(int index, std::int64_t value);
  Stmt& bind(int index, double value);
  Stmt& bind(int index, std::string_view text, bool stable = false);
  Stmt& bind_null(int index);
  /// True when a row is ready (read it with the column functions), false at the end.
  bool step();
  /// Steps to the end (a statement that returns no rows), then resets.
  void run();
  void reset();  // ready to run again; bindings are kept

  // Columns are numbered from 0.
  bool is_null(int column) const;
  std::int64_t integer(int column) const;
  double real(int column) const;
  std::string_view text(int column) const;  // valid until the next step or reset

 private:
  sqlite3* db_ = nullptr;
  sqlite3_stmt* stmt_ = nullptr;
};

class Db {
 public:
  Db() = default;
  /// Opens (and, with `create`, makes) the database file; `read_only` opens it for reading only.
  explicit Db(const std::string& path, bool create = true, bool read_only = false);
  ~Db();
  Db(Db&& other) noexcept;
  Db& operator=(Db&& other) noexcept;
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  /// Runs one or more statements that return nothing.
  void exec(const std::string& sql);
  Stmt prepare(std::string_view sql) { return Stmt(db_, sql); }
  std::int64_t last_insert_rowid() const;
  std::int64_t changes() const;
  bool is_open() const { return db_ != nullptr; }
  sqlite3* handle() const { return db_; }

 private:
  sqlite3* db_ = nullptr;
};

/// A transaction: BEGIN (IMMEDIATE: the write lock at once) on construction, ROLLBACK at
/// destruction unless commit() ran.
class Transaction {
 public:
  explicit Transaction(Db& db);
  ~Transaction();
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  void commit();

 private:
  Db& db_;
  bool done_ = false;
};

}  // namespace machina::sql
