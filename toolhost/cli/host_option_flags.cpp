// The host's options on the command line, made from the option table.
#include "host_option_flags.hpp"

#include <machina/host_options_table.hpp>

#include <type_traits>

namespace machina::cli {

bool parse_positive(std::string_view text, std::int64_t& out) {
  if (text.empty() || text.size() > 9) return false;
  out = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    out = out * 10 + (c - '0');
  }
  return out > 0;
}

void HostOptionFlags::add(CLI::App& app, HostOptions& options, std::string_view group) {
  visit_host_options(options, [&](const HostOptionInfo& row, auto& field) {
    using T = std::remove_reference_t<decltype(field)>;
    if (!row.on_command_line() || row.group != group) return;
    const std::string flag = "--" + std::string(row.flag);
    const std::string help(row.help);
    CLI::Option* option = nullptr;
    if constexpr (std::is_same_v<T, bool>) {
      option = app.add_flag(flag, field, help);
    } else if constexpr (std::is_integral_v<T>) {
      if (row.kind == HostOptionKind::mebibytes) {
        std::uint64_t& mib = mebibytes_[row.name];
        mib = bytes_to_mib(static_cast<std::uint64_t>(field));
        option = app.add_option(flag, mib, help)
                     ->check(CLI::Range(static_cast<std::uint64_t>(row.min), static_cast<std::uint64_t>(row.max)))
                     ->capture_default_str();
      } else {
        option = app.add_option(flag, field, help)->check(CLI::Range(static_cast<T>(row.min), static_cast<T>(row.max)));
        if (row.kind == HostOptionKind::number) option->capture_default_str();
      }
    } else if constexpr (std::is_same_v<T, std::string>) {
      option = app.add_option(flag, field, help);
      if (row.kind == HostOptionKind::path) option->type_name("FILE");
    } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      option = app.add_option(flag, field, help)->type_name("NAME");
    } else if constexpr (std::is_enum_v<T>) {
      option = app.add_option_function<std::string>(
                      flag, [&field](const std::string& text) { field = *parse_choice<T>(text); }, help)
                   ->check(CLI::IsMember(choice_names<T>()))
                   ->default_str(std::string(choice_name(field)));
    } else if constexpr (is_timeout_map<T>::value) {
      option = app.add_option(flag, timeouts_[row.name], help)->type_name("AID=MS");
    } else {
      static_assert(sizeof(T) == 0, "a host option of a type the command line cannot take");
    }
    if (!row.group.empty()) option->group(std::string(row.group));
  });
}

void HostOptionFlags::finish(HostOptions& options) const {
  if (options.limits_need_isolation()) {
    throw ConfigError("OS limits (--limit-*, --no-network) apply to isolated tools: add --isolation process");
  }
  visit_host_options(options, [&](const HostOptionInfo& row, auto& field) {
    using T = std::remove_reference_t<decltype(field)>;
    if constexpr (is_timeout_map<T>::value) {
      const auto given = timeouts_.find(row.name);
      if (given == timeouts_.end()) return;
      for (const auto& spec : given->second) {
        const auto eq = spec.rfind('=');
        std::int64_t ms = 0;
        if (eq == std::string::npos || eq == 0 || !parse_positive(spec.substr(eq + 1), ms) ||
            !host_option_in_range(row, ms)) {
          throw ConfigError("--" + std::string(row.flag) + " " + spec + ": expected AID=MILLISECONDS");
        }
        field[spec.substr(0, eq)] = ms;
      }
    } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      if (row.kind != HostOptionKind::mebibytes) return;
      if (const auto given = mebibytes_.find(row.name); given != mebibytes_.end()) {
        field = static_cast<T>(mib_to_bytes(given->second));
      }
    }
  });
}

}  // namespace machina::cli
