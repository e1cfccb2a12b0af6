// The command line's subcommands.
#include "subcommands.hpp"

#include <machina/clock.hpp>
#include <machina/errors.hpp>
#include <machina/lease.hpp>

#include <nlohmann/json.hpp>

#include <iostream>

namespace machina::cli {

void Subcommands::add(CLI::App& app) {
  // The command line a dispatch layer builds for `machina_cli`: `tool_exec [PLUGIN] AID`,
  // the request on stdin, served as --run.
  tool_exec = app.add_subcommand("tool_exec",
                                 "Run one call as --run [PLUGIN] AID does (the command line "
                                 "a dispatch layer gives machina_cli; docs/operations.md)");
  tool_exec->add_option("aid", tool_exec_args, "[PLUGIN] AID")->expected(1, 2)->required();
  tool_exec->fallthrough();
  CLI::App* lease =
      app.add_subcommand("lease", "Operator commands for leases (need MACHINA_LEASE_SECRET or MACHINA_LEASE_KEY_FILE)");
  lease->require_subcommand(1);
  lease_issue = lease->add_subcommand("issue", "Print a single-use lease token for one tool");
  lease_issue->add_option("--aid", lease_aid, "The tool the lease is for")->required();
  lease_issue->add_option("--ttl", lease_ttl_s, "Seconds the lease stays valid")->capture_default_str();

  audit = app.add_subcommand("audit", "Questions about the audit store");
  audit->require_subcommand(1);
  audit_report = audit->add_subcommand(
      "report",
      "Most used tools, most accessed paths, error rates and latency percentiles per tool, over a time range");
  audit_report
      ->add_option("--db", report.db_path,
                   "The audit database (default: $MACHINA_TOOLHOST_AUDIT_DB, else the default store)")
      ->type_name("FILE");
  audit_report->add_option("--since", report_since, "From this time (UTC YYYY-MM-DD[THH:MM[:SS]], or 24h, 7d ... ago)");
  audit_report->add_option("--until", report_until, "Until this time (excluded), as --since");
  audit_report->add_option("--top", report.top, "How many tools, paths and users to list")
      ->check(CLI::Range(std::size_t{1}, std::size_t{100'000}))
      ->capture_default_str();
  audit_report->add_option("--format", report_format, "text or json")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
}

int Subcommands::run_operator_command(const std::string& default_db) {
  if (*audit_report) {
    if (report.db_path.empty()) report.db_path = default_db;  // (the default store, if none is named)
    if (report.db_path.empty()) throw ConfigError("audit report: name the database (--db FILE)");
    const std::int64_t now = unix_now_ms();
    if (!report_since.empty()) report.since_ms = parse_audit_time(report_since, now);
    if (!report_until.empty()) report.until_ms = parse_audit_time(report_until, now);
    const auto result = machina::audit_report(report);
    std::cout << (report_format == "json" ? result.dump(2) + "\n" : audit_report_text(result));
    return 0;
  }
  LeaseAuthority authority(load_lease_secret(), {});
  const auto ttl_ms = lease_ttl_ms(lease_ttl_s, authority.options().max_ttl_ms);
  std::cout << authority.issue(lease_aid, ttl_ms, unix_now_ms()) << "\n";
  return 0;
}

}  // namespace machina::cli
