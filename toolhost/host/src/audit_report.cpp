// `machina-toolhost audit report`: the audit store's questions answered (audit.hpp).
#include <machina/audit.hpp>
#include <machina/sqlite_db.hpp>

#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <sstream>

namespace machina {

namespace {

/// The nearest-rank percentile of `n` sorted values: the value at rank ceil(p/100 · n).
std::size_t rank_of(double p, std::size_t n) {
  return std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(n))));
}

}  // namespace

std::int64_t parse_audit_time(const std::string& text, std::int64_t now_ms) {
  if (text == "now") return now_ms;
  // A span back from now: 90s, 30m, 24h, 7d.
  if (text.size() >= 2 && std::isdigit(static_cast<unsigned char>(text[0]))) {
    const char unit = text.back();
    const std::string number = text.substr(0, text.size() - 1);
    if (std::all_of(number.begin(), number.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }) &&
        number.size() <= 9) {
      const std::int64_t n = std::stoll(number);
      const std::int64_t unit_ms = unit == 's'   ? 1000
                                   : unit == 'm' ? 60'000
                                   : unit == 'h' ? 3'600'000
                                   : unit == 'd' ? 86'400'000
                                                 : 0;
      if (unit_ms > 0) return now_ms - n * unit_ms;
    }
  }
  // A moment in UTC: 2026-11-25, 2026-11-25T14:00, 2026-11-25T14:00:05, with an optional Z.
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, s = 0;
  bool ok = false;
  auto digits = [&](std::size_t at, std::size_t n, int& out) {
    if (at + n > text.size()) return false;
    out = 0;
    for (std::size_t i = at; i < at + n; ++i) {
      if (!std::isdigit(static_cast<unsigned char>(text[i]))) return false;
      out = out * 10 + (text[i] - '0');
    }
    return true;
  };
  if (digits(0, 4, y) && text.size() >= 10 && text[4] == '-' && digits(5, 2, mo) && text[7] == '-' && digits(8, 2, d)) {
    std::string_view rest = std::string_view(text).substr(10);
    if (rest.empty()) {
      ok = true;
    } else if (rest.size() >= 6 && rest[0] == 'T' && digits(11, 2, h) && rest[3] == ':' && digits(14, 2, mi)) {
      rest.remove_prefix(6);
      if (rest.size() >= 3 && rest[0] == ':' && digits(17, 2, s)) rest.remove_prefix(3);
      ok = rest.empty() || rest == "Z";
    }
  }
  if (ok && mo >= 1 && mo <= 12 && d >= 1 && d <= 31 && h < 24 && mi < 60 && s < 61) {
    tm t{};
    t.tm_year = y - 1900;
    t.tm_mon = mo - 1;
    t.tm_mday = d;
    t.tm_hour = h;
    t.tm_min = mi;
    t.tm_sec = s;
    return static_cast<std::int64_t>(timegm(&t)) * 1000;
  }
  throw ConfigError("'" + text +
                    "' is not a time: use YYYY-MM-DD, YYYY-MM-DDTHH:MM[:SS][Z] (UTC), now, or a span "
                    "back from now such as 90s, 30m, 24h, 7d");
}

nlohmann::json audit_report(const AuditReportOptions& o) {
  struct stat info{};
  // Calls of processes that appended to the pending file (AuditOptions::pending) are taken
  // in first, where the store lets this user write (bounds set so that nothing is pruned).
  if (::stat((o.db_path + "-pending").c_str(), &info) == 0 && info.st_size > 0) {
    AuditOptions taker;
    taker.db_path = o.db_path;
    taker.retention_days = 1'000'000;
    taker.max_rows = INT64_MAX / 2;
    try {
      AuditLog::take_in_pending(taker);
    } catch (const ConfigError&) {
      // (read what the database holds)
    }
  }
  if (::stat(o.db_path.c_str(), &info) != 0) throw ConfigError("no audit store at " + o.db_path);
  try {
    sql::Db db(o.db_path, /*create=*/false, /*read_only=*/true);
    {
      auto schema = db.prepare("SELECT value FROM meta WHERE key = 'schema'");
      if (!schema.step() || (schema.text(0) != kAuditSchema && schema.text(0) != kAuditSchemaMigrated)) {
        throw ConfigError(o.db_path + " is not an audit store of this version");
      }
    }
    const std::int64_t since = o.since_ms.value_or(INT64_MIN), until = o.until_ms.value_or(INT64_MAX);
    auto ranged = [&](std::string_view sql) {
      sql::Stmt st = db.prepare(sql);
      st.bind(1, since).bind(2, until);
      return st;
    };
    // The calls in range, unpacked from their batches once for every question below.
    ranged(
        "CREATE TEMP TABLE span AS SELECT b.first_call + j.key AS id, b.base_ms + json_extract(j.value, '$[0]') AS "
        "ts_ms,"
        " b.shape AS shape, json_extract(j.value, '$[1]') AS duration_us FROM batches b, json_each(b.calls) j"
        " WHERE b.max_ms >= ?1 AND b.min_ms < ?2 AND ts_ms >= ?1 AND ts_ms < ?2")
        .run();
    nlohmann::json out;
    out["db"] = o.db_path;
    out["since"] = o.since_ms ? nlohmann::json(audit_iso_time(*o.since_ms)) : nlohmann::json(nullptr);
    out["until"] = o.until_ms ? nlohmann::json(audit_iso_time(*o.until_ms)) : nlohmann::json(nullptr);

    auto totals = ranged(
        "SELECT count(*), coalesce(sum(k.code != 'ok'), 0), min(c.ts_ms), max(c.ts_ms) FROM span c"
        " JOIN shapes s ON s.id = c.shape JOIN codes k ON k.id = s.code WHERE c.ts_ms >= ?1 AND c.ts_ms < ?2");
    totals.step();
    const std::int64_t calls = totals.integer(0);
    out["calls"] = calls;
    out["errors"] = totals.integer(1);
    out["error_rate"] = calls > 0 ? static_cast<double>(totals.integer(1)) / static_cast<double>(calls) : 0.0;
    out["first_call"] = calls > 0 ? nlohmann::json(audit_iso_time(totals.integer(2))) : nlohmann::json(nullptr);
    out["last_call"] = calls > 0 ? nlohmann::json(audit_iso_time(totals.integer(3))) : nlohmann::json(nullptr);

    // Per tool: calls, errors, their types, latency percentiles (every tool; sorted by use).
    struct ToolRow {
      std::string name;
      std::int64_t calls = 0, errors = 0, max_us = 0;
      std::map<std::string, std::int64_t> by_type;
      nlohmann::json latency;
    };
    std::map<std::int64_t, ToolRow> tools;
    std::vector<std::int64_t> order;
    auto per_tool = ranged(
        "SELECT s.tool, t.name, count(*), coalesce(sum(k.code != 'ok'), 0), max(c.duration_us) FROM span c"
        " JOIN shapes s ON s.id = c.shape JOIN tools t ON t.id = s.tool JOIN codes k ON k.id = s.code"
        " WHERE c.ts_ms >= ?1 AND c.ts_ms < ?2 GROUP BY s.tool ORDER BY count(*) DESC, t.name");
    while (per_tool.step()) {
      ToolRow& row = tools[per_tool.integer(0)];
      row.name = per_tool.text(1);
      row.calls = per_tool.integer(2);
      row.errors = per_tool.integer(3);
      row.max_us = per_tool.integer(4);
      order.push_back(per_tool.integer(0));
    }
    auto types = ranged(
        "SELECT s.tool, coalesce(k.error_type, k.code), count(*) FROM span c JOIN shapes s ON s.id = c.shape"
        " JOIN codes k ON k.id = s.code WHERE c.ts_ms >= ?1 AND c.ts_ms < ?2 AND k.code != 'ok' GROUP BY s.tool, 2");
    while (types.step()) tools[types.integer(0)].by_type[std::string(types.text(1))] = types.integer(2);
    // Percentiles from the durations in order, one tool after the other (nothing kept but
    // the ranks wanted).
    auto durations = ranged(
        "SELECT s.tool, c.duration_us FROM span c JOIN shapes s ON s.id = c.shape WHERE c.ts_ms >= ?1 AND c.ts_ms < ?2"
        " ORDER BY s.tool, c.duration_us");
    std::int64_t current = -1;
    std::size_t seen = 0;
    static constexpr std::array<std::pair<double, const char*>, 4> kWanted = {
        {{50, "p50"}, {90, "p90"}, {95, "p95"}, {99, "p99"}}};
    while (durations.step()) {
      const std::int64_t tool = durations.integer(0);
      if (tool != current) {
        current = tool;
        seen = 0;
      }
      ++seen;
      ToolRow& row = tools[tool];
      for (const auto& [p, name] : kWanted) {
        if (seen == rank_of(p, static_cast<std::size_t>(row.calls))) row.latency[name] = durations.integer(1);
      }
    }
    nlohmann::json per = nlohmann::json::array();
    for (const std::int64_t id : order) {
      ToolRow& row = tools[id];
      row.latency["max"] = row.max_us;
      per.push_back(
          {{"tool", row.name},
           {"calls", row.calls},
           {"errors", row.errors},
           {"error_rate", row.calls > 0 ? static_cast<double>(row.errors) / static_cast<double>(row.calls) : 0.0},
           {"errors_by_type", row.by_type},
           {"latency_us", row.latency}});
    }
    out["tools"] = per;
    nlohmann::json most = nlohmann::json::array();
    for (std::size_t i = 0; i < order.size() && i < o.top; ++i) {
      most.push_back({{"tool", tools[order[i]].name}, {"calls", tools[order[i]].calls}});
    }
    out["most_used_tools"] = most;

    auto paths = ranged(
        "SELECT a.path, count(*), group_concat(DISTINCT t.name) FROM span c JOIN shapes s ON s.id = c.shape"
        " JOIN tools t ON t.id = s.tool JOIN args a ON a.id = s.args WHERE c.ts_ms >= ?1 AND c.ts_ms < ?2"
        " AND a.path IS NOT NULL GROUP BY a.path ORDER BY count(*) DESC, a.path LIMIT ?3");
    paths.bind(3, static_cast<std::int64_t>(o.top));
    nlohmann::json by_path = nlohmann::json::array();
    while (paths.step()) {
      std::vector<std::string> names;
      std::stringstream in{std::string(paths.text(2))};
      for (std::string name; std::getline(in, name, ',');) names.push_back(name);
      std::sort(names.begin(), names.end());
      by_path.push_back({{"path", std::string(paths.text(0))}, {"calls", paths.integer(1)}, {"tools", names}});
    }
    out["most_accessed_paths"] = by_path;

    auto fronts = ranged(
        "SELECT f.name, count(*) FROM span c JOIN shapes s ON s.id = c.shape JOIN fronts f ON f.id = s.front"
        " WHERE c.ts_ms >= ?1 AND c.ts_ms < ?2 GROUP BY s.front ORDER BY count(*) DESC, f.name");
    nlohmann::json by_front = nlohmann::json::object();
    while (fronts.step()) by_front[std::string(fronts.text(0))] = fronts.integer(1);
    out["fronts"] = by_front;

    auto users = ranged(
        "SELECT u.name, count(*) FROM span c JOIN shapes s ON s.id = c.shape JOIN users u ON u.id = s.user"
        " WHERE c.ts_ms >= ?1 AND c.ts_ms < ?2 GROUP BY s.user ORDER BY count(*) DESC, u.name LIMIT ?3");
    users.bind(3, static_cast<std::int64_t>(o.top));
    nlohmann::json by_user = nlohmann::json::array();
    while (users.step()) by_user.push_back({{"user", std::string(users.text(0))}, {"calls", users.integer(1)}});
    out["users"] = by_user;
    return out;
  } catch (const sql::Error& e) {
    throw ConfigError("audit store " + o.db_path + ": " + e.what());
  }
}

std::string audit_report_text(const nlohmann::json& r) {
  std::ostringstream out;
  auto text = [](const nlohmann::json& v) { return v.is_null() ? std::string("-") : v.get<std::string>(); };
  out << "Audit store " << r["db"].get<std::string>() << ", calls from " << text(r["since"]) << " to "
      << text(r["until"]) << "\n";
  out << r["calls"].get<std::int64_t>() << " calls";
  if (r["calls"].get<std::int64_t>() > 0) {
    char rate[32];
    std::snprintf(rate, sizeof rate, "%.1f%%", 100.0 * r["error_rate"].get<double>());
    out << " (" << text(r["first_call"]) << " .. " << text(r["last_call"]) << "), " << r["errors"].get<std::int64_t>()
        << " failed (" << rate << ")";
  }
  out << "\n";
  char line[512];
  out << "\nMost used tools\n";
  for (const auto& t : r["most_used_tools"]) {
    std::snprintf(line, sizeof line, "  %10lld  %s\n", static_cast<long long>(t["calls"].get<std::int64_t>()),
                  t["tool"].get<std::string>().c_str());
    out << line;
  }
  out << "\nMost accessed paths\n";
  if (r["most_accessed_paths"].empty()) out << "  (none)\n";
  for (const auto& p : r["most_accessed_paths"]) {
    std::string names;
    for (const auto& n : p["tools"]) names += (names.empty() ? "" : ", ") + n.get<std::string>();
    std::snprintf(line, sizeof line, "  %10lld  %s  (%s)\n", static_cast<long long>(p["calls"].get<std::int64_t>()),
                  p["path"].get<std::string>().c_str(), names.c_str());
    out << line;
  }
  out << "\nErrors and latency per tool (microseconds)\n";
  std::snprintf(line, sizeof line, "  %-32s %10s %8s %10s %10s %10s %10s  %s\n", "tool", "calls", "errors", "p50",
                "p90", "p99", "max", "error types");
  out << line;
  for (const auto& t : r["tools"]) {
    std::string kinds;
    for (const auto& [type, n] : t["errors_by_type"].items()) {
      kinds += (kinds.empty() ? "" : ", ") + type + " " + std::to_string(n.get<std::int64_t>());
    }
    char rate[32];
    std::snprintf(rate, sizeof rate, "%.1f%%", 100.0 * t["error_rate"].get<double>());
    const auto& lat = t["latency_us"];
    auto us = [&](const char* k) { return lat.contains(k) ? std::to_string(lat[k].get<std::int64_t>()) : "-"; };
    std::snprintf(line, sizeof line, "  %-32s %10lld %8s %10s %10s %10s %10s  %s\n",
                  t["tool"].get<std::string>().c_str(), static_cast<long long>(t["calls"].get<std::int64_t>()), rate,
                  us("p50").c_str(), us("p90").c_str(), us("p99").c_str(), us("max").c_str(), kinds.c_str());
    out << line;
  }
  out << "\nCalls per front\n";
  for (const auto& [front, n] : r["fronts"].items()) {
    std::snprintf(line, sizeof line, "  %10lld  %s\n", static_cast<long long>(n.get<std::int64_t>()), front.c_str());
    out << line;
  }
  if (!r["users"].empty()) {
    out << "\nMost active users\n";
    for (const auto& u : r["users"]) {
      std::snprintf(line, sizeof line, "  %10lld  %s\n", static_cast<long long>(u["calls"].get<std::int64_t>()),
                    u["user"].get<std::string>().c_str());
      out << line;
    }
  }
  return out.str();
}

}  // namespace machina
