// The host's options on the command line, one flag per row of the option table
// (machina/host_options.def), with the row's range, default, --help group and text.
#pragma once

#include <machina/host_options.hpp>

#include <CLI/CLI.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace machina::cli {

class HostOptionFlags {
 public:
  /// Adds the flags of the table's rows in `group` ("": the general options), bound to the
  /// members of `options`, whose values are the defaults shown. `options` must outlive the
  /// parse.
  void add(CLI::App& app, HostOptions& options, std::string_view group);
  /// After the parse: the values given in another shape than their member's (AID=MS, MiB).
  /// Throws ConfigError for a malformed one.
  void finish(HostOptions& options) const;

 private:
  std::map<std::string_view, std::vector<std::string>> timeouts_;  // per row: the AID=MS given
  std::map<std::string_view, std::uint64_t> mebibytes_;            // per row: the MiB given (or the default's)
};

/// A decimal integer of at most 9 digits, above 0.
bool parse_positive(std::string_view text, std::int64_t& out);

}  // namespace machina::cli
