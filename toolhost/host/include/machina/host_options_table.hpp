// The host's options as a table (host_options.def): each row's name, flag, kind, range,
// environment variable, --help group and help text, and a visitor that hands each row
// its HostOptions member. The command line and the Python binding are made from it.
#pragma once

#include <machina/audit.hpp>
#include <machina/host_options.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace machina {

/// How an option's value is given.
enum class HostOptionKind {
  number,       // an integer in [min, max]
  per_worker,   // an integer in [min, max]; on the command line its default is the front's --workers
  limit,        // an OS limit: an integer in [min, max], or 0 (from Python) for none
  mebibytes,    // an integer of MiB in [min, max], kept in bytes
  flag,         // on or off
  text,         // a string
  path,         // a file's path
  names,        // a list of strings; on the command line the flag is repeated
  choice,       // one of the names OptionChoices<T> lists
  timeouts,     // tool aid -> milliseconds in [min, max]: AID=MS repeated, or a dict
  environment,  // set by its environment variable only (HostOptions::from_env)
};

struct HostOptionInfo {
  std::string_view name;  // the Python keyword
  std::string_view flag;  // the command line's, without "--"; "": none
  HostOptionKind kind;
  std::int64_t min;
  std::int64_t max;
  std::string_view env;    // "" : none
  std::string_view group;  // "" : the general options
  std::string_view help;

  bool on_command_line() const { return !flag.empty() && kind != HostOptionKind::environment; }
  bool python_keyword() const { return kind != HostOptionKind::environment; }
  bool ranged() const {
    return kind == HostOptionKind::number || kind == HostOptionKind::per_worker || kind == HostOptionKind::limit ||
           kind == HostOptionKind::mebibytes || kind == HostOptionKind::timeouts;
  }
};

inline constexpr HostOptionInfo kHostOptions[] = {
#define MACHINA_HOST_OPTION(name, flag, field, kind, min, max, env, group, help) \
  {#name, flag, HostOptionKind::kind, min, max, env, group, help},
#include <machina/host_options.def>
#undef MACHINA_HOST_OPTION
};

/// Calls f(const HostOptionInfo&, member&) for each row, in the table's order.
template <class F>
void visit_host_options(HostOptions& options, F&& f) {
  std::size_t row = 0;
#define MACHINA_HOST_OPTION(name, flag, field, kind, min, max, env, group, help) f(kHostOptions[row++], options.field);
#include <machina/host_options.def>
#undef MACHINA_HOST_OPTION
}

/// The row named `name` (the Python keyword), or nullptr.
constexpr const HostOptionInfo* find_host_option(std::string_view name) {
  for (const auto& row : kHostOptions) {
    if (row.name == name) return &row;
  }
  return nullptr;
}

/// The names a `choice` option takes, in the order --help lists them.
template <class E>
struct OptionChoices;
template <>
struct OptionChoices<Isolation> {
  static constexpr std::pair<std::string_view, Isolation> values[] = {{"inline", Isolation::inline_threads},
                                                                      {"process", Isolation::process}};
};
template <>
struct OptionChoices<AuditRequired> {
  static constexpr std::pair<std::string_view, AuditRequired> values[] = {
      {"leased", AuditRequired::leased}, {"all", AuditRequired::all}, {"none", AuditRequired::none}};
};

template <class E>
std::optional<E> parse_choice(std::string_view text) {
  for (const auto& [name, value] : OptionChoices<E>::values) {
    if (name == text) return value;
  }
  return std::nullopt;
}

template <class E>
std::string_view choice_name(E value) {
  for (const auto& [name, v] : OptionChoices<E>::values) {
    if (v == value) return name;
  }
  return {};
}

/// The names a `choice` option takes, in OptionChoices' order.
template <class E>
std::vector<std::string> choice_names() {
  std::vector<std::string> names;
  for (const auto& [name, value] : OptionChoices<E>::values) names.emplace_back(name);
  return names;
}

/// "'inline' or 'process'", "'leased', 'all' or 'none'".
template <class E>
std::string choice_list() {
  std::string out;
  const std::size_t n = std::size(OptionChoices<E>::values);
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0) out += i + 1 == n ? " or " : ", ";
    out += "'" + std::string(OptionChoices<E>::values[i].first) + "'";
  }
  return out;
}

/// Whether T is the member type of a `timeouts` row (tool aid -> milliseconds).
template <class T>
struct is_timeout_map : std::false_type {};
template <class C>
struct is_timeout_map<std::map<std::string, std::int64_t, C>> : std::true_type {};

/// A `mebibytes` row's member (bytes) as the MiB it is given in, and back.
template <class T>
constexpr T bytes_to_mib(T bytes) {
  return bytes >> 20;
}
template <class T>
constexpr T mib_to_bytes(T mib) {
  return mib << 20;
}

/// Whether `value` is in the row's range (a `limit` also takes 0: none).
constexpr bool host_option_in_range(const HostOptionInfo& row, std::int64_t value) {
  if (row.kind == HostOptionKind::limit && value == 0) return true;
  return value >= row.min && value <= row.max;
}

}  // namespace machina
