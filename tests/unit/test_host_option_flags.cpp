// The host's options on the command line, made from the table: ranges refused as CLI11
// words them, AID=MS and MiB converted after the parse, choices set through their names.
#include "../../toolhost/cli/host_option_flags.hpp"

#include <machina/errors.hpp>
#include <machina/host_options_table.hpp>

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace machina;

namespace {

struct Parsed {
  CLI::App app{"test"};
  HostOptions options;
  cli::HostOptionFlags flags;
  Parsed() {
    for (const char* group : {"", "Deadlines and isolation", "Audit"}) flags.add(app, options, group);
  }
  void parse(std::vector<std::string> args) {
    std::reverse(args.begin(), args.end());  // (CLI11 takes them last first)
    app.parse(args);
    flags.finish(options);
  }
};

}  // namespace

TEST_CASE("every row of the table with a flag is an option, in its group") {
  Parsed p;
  for (const auto& row : kHostOptions) {
    if (!row.on_command_line()) continue;
    const CLI::Option* option = p.app.get_option_no_throw("--" + std::string(row.flag));
    REQUIRE_MESSAGE(option != nullptr, row.name);
    CHECK(option->get_group() == (row.group.empty() ? std::string("Options") : std::string(row.group)));
  }
}

TEST_CASE("a value out of range is refused, the ends are taken") {
  Parsed low;
  CHECK_THROWS_AS(low.parse({"--max-request-bytes", "1"}), CLI::ValidationError);
  Parsed ends;
  ends.parse({"--max-request-bytes", "2", "--breaker-window-ms", "86400000"});
  CHECK(ends.options.max_request_bytes == 2);
  CHECK(ends.options.breaker.window_ms == 86'400'000);
  Parsed high;
  CHECK_THROWS_AS(high.parse({"--breaker-window-ms", "86400001"}), CLI::ValidationError);
  Parsed limit;
  CHECK_THROWS_AS(limit.parse({"--limit-memory-mb", "15"}), CLI::ValidationError);
}

TEST_CASE("per-tool deadlines are AID=MS, each in the deadline's range") {
  Parsed p;
  p.parse({"--tool-timeout", "AID.A.v1=50", "--tool-timeout", "AID.B=v1=7"});
  CHECK(p.options.tool_timeouts_ms.at("AID.A.v1") == 50);
  CHECK(p.options.tool_timeouts_ms.at("AID.B=v1") == 7);  // the last '=' splits
  for (const char* bad : {"AID.A.v1=0", "=5", "AID.A.v1", "AID.A.v1=1000000000", "AID.A.v1=5ms"}) {
    Parsed q;
    CHECK_THROWS_WITH_AS(q.parse({"--tool-timeout", bad}), doctest::Contains("expected AID=MILLISECONDS"), ConfigError);
  }
}

TEST_CASE("the audit lines cap is given in MiB and kept in bytes") {
  Parsed p;
  p.parse({"--audit-jsonl-max-mb", "3"});
  CHECK(p.options.audit.jsonl_max_bytes == std::uint64_t{3} << 20);
  Parsed zero;
  CHECK_THROWS_AS(zero.parse({"--audit-jsonl-max-mb", "0"}), CLI::ValidationError);
  Parsed untouched;
  untouched.parse({});
  CHECK(untouched.options.audit.jsonl_max_bytes == HostOptions{}.audit.jsonl_max_bytes);
}

TEST_CASE("choices are set by name and refused otherwise") {
  Parsed p;
  p.parse({"--isolation", "process", "--audit-required", "all"});
  CHECK(p.options.isolation == Isolation::process);
  CHECK(p.options.audit.required == AuditRequired::all);
  Parsed bad;
  CHECK_THROWS_AS(bad.parse({"--isolation", "container"}), CLI::ValidationError);
  Parsed none;
  none.parse({});
  CHECK(none.options.isolation == Isolation::inline_threads);
}

TEST_CASE("flags, names and paths bind their members") {
  Parsed p;
  p.parse(
      {"--isolation", "process", "--no-network", "--worker-env", "A", "--worker-env", "B", "--audit-db", "/tmp/x.db"});
  CHECK(p.options.workers.limits.no_network);
  CHECK(p.options.workers.pass_env == std::vector<std::string>{"A", "B"});
  CHECK(p.options.audit.db_path == "/tmp/x.db");
}

TEST_CASE("OS limits without process isolation are refused in the command line's words") {
  Parsed p;
  CHECK_THROWS_WITH_AS(p.parse({"--no-network"}), doctest::Contains("add --isolation process"), ConfigError);
}

TEST_CASE("parse_positive takes 1 to 9 digits above 0") {
  std::int64_t v = 0;
  CHECK(cli::parse_positive("123", v));
  CHECK(v == 123);
  CHECK_FALSE(cli::parse_positive("0", v));
  CHECK_FALSE(cli::parse_positive("", v));
  CHECK_FALSE(cli::parse_positive("1234567890", v));
  CHECK_FALSE(cli::parse_positive("-1", v));
}
