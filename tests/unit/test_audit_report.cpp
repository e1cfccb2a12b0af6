// audit_report (`machina-toolhost audit report`): the figures of calls recorded through
// AuditLog: totals, most used tools, paths, fronts and users, each list cut at `top`; the
// range [since, until); calls a one-call process left pending are taken in; a missing or
// foreign store is refused; the text form holds every section.
#include <machina/audit.hpp>
#include <machina/errors.hpp>
#include <machina/sqlite_db.hpp>

#include <doctest/doctest.h>

#include "temp_dir.hpp"

#include <nlohmann/json.hpp>

#include <string>

using namespace machina;
using json = nlohmann::json;

namespace {

AuditCall call(std::string_view aid, std::string_view input, std::string_view user = "",
               ErrorKind kind = ErrorKind::none) {
  AuditCall c;
  c.front = "serve";
  c.aid = aid;
  c.input_json = input;
  c.user = user;
  c.kind = kind;
  c.started_ns = 1'000'000;
  c.ended_ns = 1'000'000 + 20'000;
  return c;
}

/// A store holding: 3 calls of A by alice on /a, 2 of B by bob on /b (one refused), 1 of C.
std::string filled_store(const TempDir& dir) {
  AuditOptions o;
  o.db_path = (dir.path / "a.db").string();
  AuditLog log(o);
  for (int i = 0; i < 3; ++i) log.record(call("AID.A.v1", R"({"path":"/a"})", "alice"));
  log.record(call("AID.B.v1", R"({"path":"/b"})", "bob"));
  log.record(call("AID.B.v1", R"({"path":"/b"})", "bob", ErrorKind::access_denied));
  log.record(call("AID.C.v1", "{}"));
  return o.db_path;
}

}  // namespace

TEST_CASE("the report's totals and lists, ordered by calls") {
  TempDir dir;
  AuditReportOptions ro;
  ro.db_path = filled_store(dir);
  const json r = audit_report(ro);
  CHECK(r["db"] == ro.db_path);
  CHECK(r["since"].is_null());
  CHECK(r["until"].is_null());
  CHECK(r["calls"] == 6);
  CHECK(r["errors"] == 1);
  CHECK(r["error_rate"].get<double>() == doctest::Approx(1.0 / 6));
  CHECK(r["first_call"].is_string());
  CHECK(r["last_call"].is_string());
  CHECK(r["most_used_tools"] == json::parse(R"([{"tool":"AID.A.v1","calls":3},{"tool":"AID.B.v1","calls":2},)"
                                            R"({"tool":"AID.C.v1","calls":1}])"));
  CHECK(r["most_accessed_paths"] == json::parse(R"([{"path":"/a","calls":3,"tools":["AID.A.v1"]},)"
                                                R"({"path":"/b","calls":2,"tools":["AID.B.v1"]}])"));
  CHECK(r["fronts"] == json::parse(R"({"serve":6})"));
  CHECK(r["users"][0] == json::parse(R"({"user":"alice","calls":3})"));
  CHECK(r["users"][1] == json::parse(R"({"user":"bob","calls":2})"));
  bool b_seen = false;
  for (const auto& t : r["tools"]) {
    if (t["tool"] != "AID.B.v1") continue;
    b_seen = true;
    CHECK(t["calls"] == 2);
    CHECK(t["errors"] == 1);
    CHECK(t["error_rate"] == 0.5);
    CHECK(t["errors_by_type"] == json::parse(R"({"AccessDenied":1})"));
    CHECK(t["latency_us"]["max"] == 20);
  }
  CHECK(b_seen);
}

TEST_CASE("top cuts every list, a range outside the calls holds none") {
  TempDir dir;
  AuditReportOptions ro;
  ro.db_path = filled_store(dir);
  ro.top = 1;
  json r = audit_report(ro);
  CHECK(r["most_used_tools"].size() == 1);
  CHECK(r["most_accessed_paths"].size() == 1);
  CHECK(r["users"].size() == 1);
  CHECK(r["tools"].size() == 3);  // every tool's figures

  ro.top = 10;
  ro.until_ms = 0;  // before every call
  r = audit_report(ro);
  CHECK(r["calls"] == 0);
  CHECK(r["error_rate"] == 0.0);
  CHECK(r["first_call"].is_null());
  CHECK(r["until"] == "1970-01-01T00:00:00.000Z");
  CHECK(r["most_used_tools"].empty());
  CHECK(audit_report_text(r).find("(none)") != std::string::npos);
}

TEST_CASE("calls a one-call process left pending are in the report") {
  TempDir dir;
  AuditOptions o;
  o.db_path = (dir.path / "p.db").string();
  {
    AuditLog create(o);
  }
  o.pending = true;
  {
    AuditLog one(o);
    one.record(call("AID.P.v1", "{}"));
  }
  AuditReportOptions ro;
  ro.db_path = o.db_path;
  CHECK(audit_report(ro)["calls"] == 1);
}

TEST_CASE("a missing store and a foreign one are refused") {
  TempDir dir;
  AuditReportOptions ro;
  ro.db_path = (dir.path / "none.db").string();
  CHECK_THROWS_WITH_AS(audit_report(ro), doctest::Contains("no audit store at"), ConfigError);
  ro.db_path = (dir.path / "other.db").string();
  {
    sql::Db d(ro.db_path);
    d.exec("CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL); INSERT INTO meta VALUES('schema', 'x')");
  }
  CHECK_THROWS_WITH_AS(audit_report(ro), doctest::Contains("is not an audit store of this version"), ConfigError);
}

TEST_CASE("the text form holds each section of the report") {
  TempDir dir;
  AuditReportOptions ro;
  ro.db_path = filled_store(dir);
  const std::string text = audit_report_text(audit_report(ro));
  CHECK(text.rfind("Audit store " + ro.db_path + ", calls from - to -\n", 0) == 0);
  CHECK(text.find("6 calls") != std::string::npos);
  CHECK(text.find("16.7%") != std::string::npos);
  for (const char* part : {"AID.A.v1", "/a", "(AID.A.v1)", "AccessDenied 1", "alice", "serve"}) {
    CAPTURE(part);
    CHECK(text.find(part) != std::string::npos);
  }
}
