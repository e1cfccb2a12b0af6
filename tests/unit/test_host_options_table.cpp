// The host option table (host_options.def): one row per option, flags spelt from the
// names, ranges that hold the defaults, choices that parse back.
#include <machina/host_options_table.hpp>

#include <doctest/doctest.h>

#include <set>
#include <string>
#include <type_traits>

using namespace machina;

TEST_CASE("names and flags are unique, and a flag is its name with dashes") {
  std::set<std::string_view> names, flags;
  for (const auto& row : kHostOptions) {
    CHECK(names.insert(row.name).second);
    if (row.flag.empty()) continue;
    CHECK(flags.insert(row.flag).second);
    std::string dashed(row.name);
    for (char& c : dashed) c = c == '_' ? '-' : c;
    if (row.kind == HostOptionKind::timeouts) dashed = "tool-timeout";  // repeated AID=MS, one per tool
    CHECK_MESSAGE(row.flag == dashed, row.name);
  }
  CHECK(find_host_option("max_request_bytes")->flag == "max-request-bytes");
  CHECK(find_host_option("no_such_option") == nullptr);
  // Set from Python only (the command line's workers run the program itself), or from
  // the environment only.
  CHECK_FALSE(find_host_option("worker_executable")->on_command_line());
  CHECK(find_host_option("worker_executable")->python_keyword());
  CHECK_FALSE(find_host_option("lease_enforce")->on_command_line());
  CHECK_FALSE(find_host_option("lease_enforce")->python_keyword());
  CHECK(find_host_option("lease_enforce")->env == "MACHINA_LEASE_ENFORCE");
}

TEST_CASE("every default of a number lies in its range") {
  HostOptions defaults;
  std::size_t ranged = 0;
  visit_host_options(defaults, [&](const HostOptionInfo& row, auto& field) {
    using T = std::remove_reference_t<decltype(field)>;
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      REQUIRE(row.ranged());
      CHECK(row.min <= row.max);
      const auto value = static_cast<std::int64_t>(row.kind == HostOptionKind::mebibytes ? field >> 20 : field);
      CHECK_MESSAGE(host_option_in_range(row, value), row.name);
      ++ranged;
    }
  });
  CHECK(ranged >= 20);
}

TEST_CASE("a range holds its ends only, an OS limit also takes 0 for none") {
  const auto& request = *find_host_option("max_request_bytes");
  CHECK_FALSE(host_option_in_range(request, 1));
  CHECK(host_option_in_range(request, 2));
  CHECK(host_option_in_range(request, std::int64_t{1} << 30));
  CHECK_FALSE(host_option_in_range(request, (std::int64_t{1} << 30) + 1));
  const auto& memory = *find_host_option("limit_memory_mb");
  CHECK(host_option_in_range(memory, 0));
  CHECK_FALSE(host_option_in_range(memory, 15));
  CHECK(host_option_in_range(memory, 16));
  const auto& workers = *find_host_option("isolation_workers");
  CHECK_FALSE(host_option_in_range(workers, 0));
  CHECK_FALSE(host_option_in_range(workers, 257));
}

TEST_CASE("choices parse back to their values and are listed in order") {
  CHECK(parse_choice<Isolation>("process") == Isolation::process);
  CHECK(parse_choice<Isolation>("inline") == Isolation::inline_threads);
  CHECK_FALSE(parse_choice<Isolation>("container").has_value());
  CHECK(choice_name(Isolation::inline_threads) == "inline");
  CHECK(choice_list<Isolation>() == "'inline' or 'process'");
  CHECK(parse_choice<AuditRequired>("all") == AuditRequired::all);
  CHECK(choice_name(HostOptions{}.audit.required) == "leased");
  CHECK(choice_list<AuditRequired>() == "'leased', 'all' or 'none'");
}

TEST_CASE("the visitor hands each row its own member") {
  HostOptions o;
  visit_host_options(o, [](const HostOptionInfo& row, auto& field) {
    using T = std::remove_reference_t<decltype(field)>;
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      if (row.name == "max_stuck_calls") field = 7;
      if (row.name == "audit_jsonl_max_mb") field = 5;
    }
  });
  CHECK(o.max_stuck_calls == 7);
  CHECK(o.audit.jsonl_max_bytes == 5);
  CHECK(o.max_request_bytes == HostOptions{}.max_request_bytes);
}
