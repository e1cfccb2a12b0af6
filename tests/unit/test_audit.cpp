// The audit store (audit.hpp): the digest of a call's arguments, recording from many
// threads into SQLite with nothing lost, the bounds, and the report's figures.
#include <machina/audit.hpp>
#include <machina/sqlite_db.hpp>

#include "temp_dir.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

using namespace machina;
using json = nlohmann::json;

namespace {

json digest(std::string_view input, std::string* path = nullptr) {
  return json::parse(audit_digest(input, false, path));
}

std::int64_t count(const std::string& db, const char* sql) {
  sql::Db d(db, false, true);
  auto st = d.prepare(sql);
  REQUIRE(st.step());
  return st.integer(0);
}

AuditCall call(std::string_view aid, std::string_view input, std::int64_t duration_us = 10) {
  AuditCall c;
  c.front = "serve";
  c.aid = aid;
  c.input_json = input;
  c.started_ns = 1'000'000;
  c.ended_ns = 1'000'000 + duration_us * 1000;
  return c;
}

}  // namespace

TEST_CASE("the digest keeps where a call reaches and never what it carries") {
  std::string path;
  CHECK(digest(R"({"path":"/srv/a.txt","content":"secret","append":true,"n":3,"opts":{"x":1},"tags":["a"]})", &path) ==
        json::parse(R"({"path":"/srv/a.txt","content":"<string, 6 bytes>","append":true,"n":"<number>",)"
                    R"("opts":"<object>","tags":"<array>"})"));
  CHECK(path == "/srv/a.txt");
  CHECK(digest(R"({"command":"ls","args":["-la","/tmp",3,null],"cwd":"src"})", &path) ==
        json::parse(R"({"command":"ls","args":["-la","/tmp","<number>",null],"cwd":"src"})"));
  CHECK(path == "src");
  CHECK(digest(R"({"query":"async handler","limit":10})") ==
        json::parse(R"({"query":"async handler","limit":"<number>"})"));
  // Not an object, not JSON, cut: described.
  CHECK(digest("[1,2,3]") == json::parse(R"({"<input>":"<array, 7 bytes>"})"));
  CHECK(digest("\"text\"") == json::parse(R"({"<input>":"<string, 6 bytes>"})"));
  CHECK(digest("{not json") == json::parse(R"({"<input>":"<input, 9 bytes, not digested>"})"));
  CHECK(json::parse(audit_digest(R"({"path":"x")", true, &path)) ==
        json::parse(R"({"<input>":"<input cut at 11 bytes>"})"));
  CHECK(path.empty());
}

TEST_CASE("the digest is bounded, member by member and in all") {
  const std::string long_path(5000, 'p');
  std::string path;
  const json d = digest(json{{"path", long_path}}.dump(), &path);
  CHECK(d["path"].get<std::string>().size() <= kAuditMaxValue + 3);  // cut, with an ellipsis
  CHECK(path.size() <= kAuditMaxValue + 3);
  json many = json::object();
  for (int i = 0; i < 500; ++i) many["member_" + std::to_string(i)] = "value";
  const std::string text = audit_digest(many.dump(), false, nullptr);
  CHECK(text.size() <= kAuditMaxDigest);
  const json parsed = json::parse(text);
  CHECK(parsed.contains("<more>"));
  json args = json::array();
  for (int i = 0; i < 1000; ++i) args.push_back("argument-" + std::to_string(i));
  const json cmd = digest(json{{"command", "x"}, {"args", args}}.dump());
  CHECK(cmd["args"].back() == "…");
  CHECK(cmd["args"].dump().size() <= kAuditMaxValue + 16);
}

TEST_CASE("calls recorded from many threads are all written, in one store") {
  TempDir dir;
  const std::string db = dir.path.string() + "/a.db";
  {
    AuditOptions o;
    o.db_path = db;
    o.buffer_bytes = 64 * 1024;  // small: the threads wait for the writer again and again
    AuditLog log(o);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&log, t] {
        const std::string aid = "AID.T" + std::to_string(t) + ".v1";
        for (int i = 0; i < 5000; ++i) log.record(call(aid, R"({"path":"f"})"));
      });
    }
    for (auto& t : threads) t.join();
    log.flush();
    CHECK(log.written() == 20'000);
    CHECK(count(db, "SELECT count(*) FROM calls") == 20'000);
    CHECK(count(db, "SELECT count(DISTINCT tool) FROM call_log") == 4);
    CHECK(count(db, "SELECT count(*) FROM args") == 1);  // one digest, stored once
  }
  // A thread that ended left nothing behind unwritten.
  {
    AuditOptions o;
    o.db_path = db;
    AuditLog log(o);
    std::thread([&log] { log.record(call("AID.LATE.v1", "{}")); }).join();
  }
  CHECK(count(db, "SELECT count(*) FROM call_log WHERE tool = 'AID.LATE.v1'") == 1);
}

TEST_CASE("calls of one shape share a row of batches, the view gives each call its own numbers") {
  TempDir dir;
  const std::string db = dir.path.string() + "/a.db";
  {
    AuditOptions o;
    o.db_path = db;
    AuditLog log(o);
    for (int i = 0; i < 3000; ++i) {
      AuditCall c = call("AID.S.v1", R"({"i":1})", i);
      c.output_bytes = static_cast<std::size_t>(i) * 2;
      log.record(c);
    }
    log.record(call("AID.OTHER.v1", "{}"));
  }
  CHECK(count(db, "SELECT coalesce(sum(n), 0) FROM batches") == 3001);
  CHECK(count(db, "SELECT count(*) FROM batches") >= 4);  // at most 1024 calls a row
  CHECK(count(db, "SELECT max(n) FROM batches") <= 1024);
  CHECK(count(db, "SELECT count(*) FROM calls") == 3001);
  CHECK(count(db, "SELECT count(DISTINCT id) FROM calls") == 3001);
  CHECK(count(db, "SELECT count(*) FROM call_log WHERE tool = 'AID.S.v1' AND output_bytes = 2 * duration_us") == 3000);
  CHECK(count(db, "SELECT sum(duration_us) FROM call_log WHERE tool = 'AID.S.v1'") == 2999 * 3000 / 2);
  CHECK(count(db,
              "SELECT count(*) FROM calls c JOIN batches b ON c.id >= b.first_call AND c.id < b.first_call + b.n"
              " WHERE c.ts_ms < b.min_ms OR c.ts_ms > b.max_ms") == 0);
}

TEST_CASE("a call's end read in the log's ticks is written as the steady clock's time") {
  // (ticks() is the time-stamp counter where the kernel keeps time by it: the writer maps
  // it onto the clock by readings of both, moved on as it goes.)
  TempDir dir;
  const std::string db = dir.path.string() + "/a.db";
  const auto steady_ns = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  const auto stamped = [&](AuditLog& log, std::string_view aid, std::chrono::milliseconds sleep) {
    AuditCall c = call(aid, "{}");
    c.started_ns = steady_ns();
    std::this_thread::sleep_for(sleep);
    c.ended_ns = 0;
    c.ended_ticks = log.ticks();
    log.record(c);
  };
  const std::int64_t unix_ms_before =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  {
    AuditOptions o;
    o.db_path = db;
    AuditLog log(o);
    const std::string ticks_are = log.ticks_are_tsc() ? "the time-stamp counter" : "the steady clock";
    MESSAGE("the log's ticks are " << ticks_are);
    stamped(log, "AID.T30.v1", std::chrono::milliseconds(30));
    stamped(log, "AID.T0.v1", std::chrono::milliseconds(0));
    log.flush();
    std::this_thread::sleep_for(std::chrono::milliseconds(15));  // the writer's line moves on
    stamped(log, "AID.T20.v1", std::chrono::milliseconds(20));
  }
  const std::int64_t unix_ms_after =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  const auto duration_us = [&](const char* aid) {
    return count(db, (std::string("SELECT duration_us FROM call_log WHERE tool = '") + aid + "'").c_str());
  };
  // A sleep runs at least as long as asked; the upper bounds leave room for a slow machine.
  CHECK(duration_us("AID.T30.v1") >= 30'000);
  CHECK(duration_us("AID.T30.v1") < 300'000);
  CHECK(duration_us("AID.T0.v1") < 10'000);
  CHECK(duration_us("AID.T20.v1") >= 20'000);
  CHECK(duration_us("AID.T20.v1") < 300'000);
  CHECK(count(db, "SELECT min(ts_ms) FROM calls") >= unix_ms_before);
  CHECK(count(db, "SELECT max(ts_ms) FROM calls") <= unix_ms_after);
}

TEST_CASE("each call is kept under the name its front gave, in the store and the lines") {
  TempDir dir;
  AuditOptions o;
  o.db_path = dir.path.string() + "/a.db";
  o.jsonl_path = dir.path.string() + "/a.jsonl";
  const std::string long_name(100, 'f');
  {
    AuditLog log(o);
    const std::string_view fronts[] = {"serve", "my-front", "", "my-front", long_name};
    for (const std::string_view front : fronts) {
      AuditCall c = call("AID.F.v1", "{}");
      c.front = front;
      log.record(c);
    }
  }
  CHECK(count(o.db_path, "SELECT count(*) FROM call_log WHERE front = 'my-front'") == 2);
  CHECK(count(o.db_path, "SELECT count(*) FROM call_log WHERE front = 'serve'") == 1);
  CHECK(count(o.db_path, "SELECT count(*) FROM call_log WHERE front = 'unknown'") == 1);
  CHECK(count(o.db_path, "SELECT max(length(front)) FROM call_log") == static_cast<std::int64_t>(kAuditMaxFront));
  std::ifstream lines(o.jsonl_path);
  std::vector<std::string> fronts;
  for (std::string line; std::getline(lines, line);) fronts.push_back(json::parse(line)["front"]);
  CHECK(fronts == std::vector<std::string>{"serve", "my-front", "unknown", "my-front", long_name.substr(0, 32)});

  // A process of one call leaves its record pending; the next to open the store takes it in.
  AuditOptions one = o;
  one.jsonl_path.clear();
  one.pending = true;
  {
    AuditLog log(one);
    AuditCall c = call("AID.PENDING.v1", "{}");
    c.front = "one-shot";
    log.record(c);
  }
  {
    AuditLog taker(o);
  }
  CHECK(count(o.db_path, "SELECT count(*) FROM call_log WHERE tool = 'AID.PENDING.v1' AND front = 'one-shot'") == 1);
}

TEST_CASE("a pending record that numbers its front is taken in under the name the number stood for") {
  // The layout a pending file's records had when the fronts were numbered: aid, user and
  // input lengths (u32), the front's number (u8), flags (u8; 8: realtime clock), the error
  // kind (u16), start and end (i64 ns), input and output bytes (u64), then the aid.
  TempDir dir;
  AuditOptions o;
  o.db_path = dir.path.string() + "/a.db";
  {
    AuditLog create(o);
  }
  const std::string aid = "AID.OLD.v1";
  const std::int64_t now_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::string record;
  const auto put = [&record](auto v) { record.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(static_cast<std::uint32_t>(aid.size()));
  put(std::uint32_t{0});
  put(std::uint32_t{0});
  put(std::uint8_t{5});  // http
  put(std::uint8_t{8});
  put(std::uint16_t{0});
  put(now_ns - 1'000'000);
  put(now_ns);
  put(std::uint64_t{2});
  put(std::uint64_t{7});
  record += aid;
  REQUIRE(record.size() == 48 + aid.size());
  std::ofstream(o.db_path + "-pending", std::ios::binary) << record << record;
  {
    AuditLog taker(o);
  }
  CHECK(count(o.db_path, "SELECT count(*) FROM call_log WHERE tool = 'AID.OLD.v1' AND front = 'http'") == 2);
  CHECK(std::filesystem::file_size(o.db_path + "-pending") == 0);
}

TEST_CASE("the store keeps at most max_rows calls, the newest") {
  TempDir dir;
  AuditOptions o;
  o.db_path = dir.path.string() + "/a.db";
  o.max_rows = 100;
  {
    AuditLog log(o);
    for (int i = 0; i < 250; ++i) log.record(call("AID.X.v1", "{\"i\":" + std::to_string(i) + "}"));
  }
  CHECK(count(o.db_path, "SELECT count(*) FROM calls") == 100);
  CHECK(count(o.db_path, "SELECT min(id) FROM calls") == 151);
}

TEST_CASE("bad settings and foreign files are refused") {
  TempDir dir;
  AuditOptions o;
  o.db_path = dir.path.string() + "/a.db";
  o.retention_days = 0;
  CHECK_THROWS_AS(AuditLog{o}, ConfigError);
  o.retention_days = 1;
  o.db_path = dir.path.string() + "/missing/dir/a.db";
  CHECK_THROWS_WITH_AS(AuditLog{o}, doctest::Contains("cannot open"), ConfigError);
  o.db_path = dir.path.string() + "/foreign.db";
  {
    sql::Db d(o.db_path);
    d.exec("CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL); INSERT INTO meta VALUES('schema', 'x 2')");
  }
  CHECK_THROWS_WITH_AS(AuditLog{o}, doctest::Contains("it holds 'x 2'"), ConfigError);
}

TEST_CASE("the report's percentiles are nearest-rank over the range asked") {
  TempDir dir;
  AuditOptions o;
  o.db_path = dir.path.string() + "/a.db";
  {
    AuditLog log(o);
    for (int i = 1; i <= 100; ++i) log.record(call("AID.X.v1", "{}", i));  // 1 .. 100 µs
    AuditCall failed = call("AID.Y.v1", R"({"path":"/p"})");
    failed.kind = ErrorKind::access_denied;
    log.record(failed);
  }
  AuditReportOptions ro;
  ro.db_path = o.db_path;
  const json r = audit_report(ro);
  CHECK(r["calls"] == 101);
  CHECK(r["errors"] == 1);
  const json& x = r["tools"][0];
  CHECK(x["tool"] == "AID.X.v1");
  CHECK(x["latency_us"] == json::parse(R"({"p50":50,"p90":90,"p95":95,"p99":99,"max":100})"));
  CHECK(r["tools"][1]["errors_by_type"] == json::parse(R"({"AccessDenied":1})"));
  CHECK(r["most_accessed_paths"] == json::parse(R"([{"path":"/p","calls":1,"tools":["AID.Y.v1"]}])"));
  ro.since_ms = 4'000'000'000'000;  // far in the future
  CHECK(audit_report(ro)["calls"] == 0);
  CHECK(audit_report_text(r).find("AID.X.v1") != std::string::npos);
}

TEST_CASE("report times: dates, moments and spans back from now") {
  const std::int64_t now = 1'800'000'000'000;
  CHECK(parse_audit_time("now", now) == now);
  CHECK(parse_audit_time("90s", now) == now - 90'000);
  CHECK(parse_audit_time("24h", now) == now - 86'400'000);
  CHECK(parse_audit_time("7d", now) == now - 7 * 86'400'000);
  CHECK(parse_audit_time("2026-11-25", now) == 1'795'564'800'000);
  CHECK(parse_audit_time("2026-11-25T14:30", now) == 1'795'564'800'000 + (14 * 60 + 30) * 60'000);
  CHECK(parse_audit_time("2026-11-25T14:30:05Z", now) == 1'795'564'800'000 + (14 * 60 + 30) * 60'000 + 5000);
  for (const char* bad : {"yesterday", "7w", "2026-13-01", "2026-11-25T25:00", "", "h", "2026-11-25 14:30"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(parse_audit_time(bad, now), ConfigError);
  }
}

TEST_CASE("credentials in kept values are masked, and nothing else") {
  const auto masked = [](std::string_view text) { return AuditCredentialMask().masked(text); };
  CHECK(masked("https://alice:pw@example.com/x?page=2") == "https://alice:***@example.com/x?page=2");
  CHECK(masked("git+ssh://git@example.com/r.git") == "git+ssh://git@example.com/r.git");  // a user, no password
  CHECK(masked("tool --password=pw --password pw2 --token t -v") ==
        "tool --password=*** --password *** --token *** -v");
  CHECK(masked("curl -H 'Authorization: Bearer abc' -H \"X-Api-Key: k1\" -u bob:pw3 u") ==
        "curl -H 'Authorization: Bearer ***' -H \"X-Api-Key: ***\" -u bob:*** u");
  CHECK(masked("https://h/p?token=a&page=2&api_key=b;sig=c#key=d") ==
        "https://h/p?token=***&page=2&api_key=***;sig=***#key=***");
  CHECK(masked("GITHUB_TOKEN=x AWS_SECRET_ACCESS_KEY=y make clientSecret=z") ==
        "GITHUB_TOKEN=*** AWS_SECRET_ACCESS_KEY=*** make clientSecret=***");
  CHECK(masked("mysql -u root -ppw shop") == "mysql -u root -p*** shop");
  // What only looks like one is kept.
  for (const char* same : {"mkdir -p build", "tar -pxf a.tar", "gen --max_tokens=100 --key 2", "ssh -p 22 host",
                           "--token --verbose", "a=b c:d", "Bearer"}) {
    CHECK(masked(same) == same);
  }
  // A flag's value in the next element of an array.
  AuditCredentialMask mask;
  CHECK(mask.masked("--password") == "--password");
  CHECK(mask.masked("pw") == "***");
  CHECK(mask.masked("Authorization: Bearer") == "Authorization: Bearer");
  CHECK(mask.masked("tok") == "***");
  mask.reset();
  CHECK(mask.masked("--token") == "--token");
  mask.reset();
  CHECK(mask.masked("plain") == "plain");
  // In the digest: values, array elements and the path.
  std::string path;
  CHECK(digest(R"({"url":"https://u:p@h/x","args":["--password","pw"],"path":"https://u:p@h/f","content":"p"})",
               &path) == json::parse(R"({"url":"https://u:***@h/x","args":["--password","***"],)"
                                     R"("path":"https://u:***@h/f","content":"<string, 1 bytes>"})"));
  CHECK(path == "https://u:***@h/f");
}

TEST_CASE("which calls the store must record") {
  TempDir dir;
  AuditOptions o;
  o.db_path = dir.path.string() + "/a.db";
  AuditLog log(o);
  CHECK(log.must_record(1));
  CHECK_FALSE(log.must_record(0));
  CHECK(log.can_record());
  CHECK(log.record_committed(call("AID.FILE.WRITE.v1", R"({"path":"x"})")));
  CHECK(count(o.db_path, "SELECT count(*) FROM calls") == 1);
}
