// The command line's subcommands: `tool_exec [PLUGIN] AID` (a call, as --run), the
// operator's `lease issue` and `audit report`.
#pragma once

#include <machina/audit.hpp>

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace machina::cli {

struct Subcommands {
  CLI::App* tool_exec = nullptr;
  std::vector<std::string> tool_exec_args;  // [PLUGIN] AID
  CLI::App* lease_issue = nullptr;
  std::string lease_aid;
  double lease_ttl_s = 60;
  CLI::App* audit = nullptr;
  CLI::App* audit_report = nullptr;
  AuditReportOptions report;
  std::string report_since, report_until, report_format = "text";

  void add(CLI::App& app);
  /// An operator's command (lease issue, audit report): no host is served.
  bool operator_command() const { return *lease_issue || *audit; }
  /// Runs the operator's command given; `default_db` is the audit store the options name
  /// (or the default one). Returns the exit code. Throws ConfigError.
  int run_operator_command(const std::string& default_db);
};

}  // namespace machina::cli
