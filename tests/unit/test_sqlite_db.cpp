// The SQLite layer (sqlite_db.hpp): statements, bindings, errors, transactions, and the
// FTS5 module this build relies on.
#include <machina/sqlite_db.hpp>

#include <doctest/doctest.h>

using namespace machina;

TEST_CASE("statements bind, step and read back every kind of value") {
  sql::Db db(":memory:");
  db.exec("CREATE TABLE t(i INTEGER, r REAL, s TEXT, n TEXT)");
  auto insert = db.prepare("INSERT INTO t VALUES(?, ?, ?, ?)");
  for (int k = 0; k < 3; ++k) {
    insert.bind(1, std::int64_t{k}).bind(2, k / 2.0).bind(3, std::string("row ") + char('a' + k)).bind_null(4).run();
  }
  CHECK(db.last_insert_rowid() == 3);
  auto select = db.prepare("SELECT i, r, s, n FROM t WHERE i >= ? ORDER BY i");
  select.bind(1, std::int64_t{1});
  REQUIRE(select.step());
  CHECK(select.integer(0) == 1);
  CHECK(select.real(1) == doctest::Approx(0.5));
  CHECK(select.text(2) == "row b");
  CHECK(select.is_null(3));
  REQUIRE(select.step());
  CHECK(select.text(2) == "row c");
  CHECK_FALSE(select.step());
}

TEST_CASE("failures carry SQLite's own message") {
  sql::Db db(":memory:");
  CHECK_THROWS_WITH_AS(db.exec("CREATE TABLE t("), doctest::Contains("incomplete input"), sql::Error);
  CHECK_THROWS_WITH_AS(db.prepare("SELECT * FROM nowhere"), doctest::Contains("no such table: nowhere"), sql::Error);
  db.exec("CREATE TABLE u(k TEXT UNIQUE)");
  auto insert = db.prepare("INSERT INTO u VALUES(?)");
  insert.bind(1, std::string_view("x")).run();
  insert.bind(1, std::string_view("x"));
  CHECK_THROWS_WITH_AS(insert.run(), doctest::Contains("UNIQUE constraint failed"), sql::Error);
  CHECK_THROWS_AS(sql::Db("/nonexistent-dir/x.db"), sql::Error);
}

TEST_CASE("a transaction rolls back unless committed") {
  sql::Db db(":memory:");
  db.exec("CREATE TABLE t(i INTEGER)");
  {
    sql::Transaction tx(db);
    db.exec("INSERT INTO t VALUES(1)");
  }
  {
    sql::Transaction tx(db);
    db.exec("INSERT INTO t VALUES(2)");
    tx.commit();
  }
  auto count = db.prepare("SELECT group_concat(i) FROM t");
  REQUIRE(count.step());
  CHECK(count.text(0) == "2");
}

TEST_CASE("FTS5 with bm25 ranking is available") {
  sql::Db db(":memory:");
  db.exec("CREATE VIRTUAL TABLE docs USING fts5(body)");
  db.exec("INSERT INTO docs VALUES('async function handler(req, res)'), ('a function'), ('nothing here')");
  auto q = db.prepare("SELECT body, bm25(docs) FROM docs WHERE docs MATCH ? ORDER BY bm25(docs)");
  q.bind(1, std::string_view("function"));
  REQUIRE(q.step());
  CHECK(q.text(0) == "a function");  // the shorter document ranks first
  CHECK(q.real(1) < 0);
  REQUIRE(q.step());
  CHECK_FALSE(q.step());
}
