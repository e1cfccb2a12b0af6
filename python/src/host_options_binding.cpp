// Host()'s keyword arguments, made from the host's option table.
#include "host_options_binding.hpp"

#include <machina/errors.hpp>
#include <machina/host_options_table.hpp>

#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace machina::binding {

namespace {

std::string type_of(py::handle v) {
  return py::str(py::type::of(v).attr("__name__"));
}

[[noreturn]] void wrong_type(const HostOptionInfo& row, const char* what, py::handle v) {
  throw py::type_error("Host option '" + std::string(row.name) + "' must be " + what + ", not " + type_of(v));
}

/// A Python int (not a bool) in the row's range.
std::int64_t ranged_int(const HostOptionInfo& row, py::handle v, const std::string& what) {
  if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v)) wrong_type(row, "an int", v);
  std::int64_t value = 0;
  try {
    value = v.cast<std::int64_t>();
  } catch (const py::cast_error&) {
    value = row.max + 1;  // (beyond 64 bits)
  }
  if (!host_option_in_range(row, value)) {
    throw ConfigError(what + " must be " + (row.kind == HostOptionKind::limit ? "0 (none) or " : "") +
                      std::to_string(row.min) + " to " + std::to_string(row.max) + ", not " + std::string(py::str(v)));
  }
  return value;
}

std::string text_of(const HostOptionInfo& row, py::handle v) {
  if (row.kind == HostOptionKind::path && !py::isinstance<py::str>(v) && py::hasattr(v, "__fspath__")) {
    v = py::module_::import("os").attr("fspath")(v);
  }
  if (!py::isinstance<py::str>(v)) wrong_type(row, row.kind == HostOptionKind::path ? "a str or path" : "a str", v);
  return v.cast<std::string>();
}

/// Sets one member from its keyword's value.
template <class T>
void set_member(const HostOptionInfo& row, T& field, py::handle v) {
  const std::string name(row.name);
  if constexpr (std::is_same_v<T, bool>) {
    if (!py::isinstance<py::bool_>(v)) wrong_type(row, "a bool", v);
    field = v.cast<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    const std::int64_t value = ranged_int(row, v, name);
    field = static_cast<T>(row.kind == HostOptionKind::mebibytes ? mib_to_bytes(value) : value);
  } else if constexpr (std::is_same_v<T, std::string>) {
    field = text_of(row, v);
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    if (py::isinstance<py::str>(v) || !py::isinstance<py::sequence>(v)) wrong_type(row, "a list of str", v);
    std::vector<std::string> out;
    for (py::handle item : v) {
      if (!py::isinstance<py::str>(item)) wrong_type(row, "a list of str", v);
      out.push_back(item.cast<std::string>());
    }
    field = std::move(out);
  } else if constexpr (std::is_enum_v<T>) {
    if (!py::isinstance<py::str>(v)) wrong_type(row, "a str", v);
    const std::string text = v.cast<std::string>();
    const auto choice = parse_choice<T>(text);
    if (!choice) throw ConfigError(name + " must be " + choice_list<T>() + ", not '" + text + "'");
    field = *choice;
  } else if constexpr (is_timeout_map<T>::value) {
    if (!py::isinstance<py::dict>(v)) wrong_type(row, "a dict of aid to int", v);
    for (const auto& [aid, ms] : v.cast<py::dict>()) {
      if (!py::isinstance<py::str>(aid)) wrong_type(row, "a dict of aid to int", v);
      const std::string key = py::cast<std::string>(aid);
      field[key] = ranged_int(row, ms, name + "['" + key + "']");
    }
  } else {
    static_assert(sizeof(T) == 0, "a host option of a type Python cannot give");
  }
}

/// The member's value as Python shows it (the default of a fresh HostOptions).
template <class T>
py::object python_value(const HostOptionInfo& row, const T& field) {
  if constexpr (std::is_enum_v<T>) {
    return py::str(std::string(choice_name(field)));
  } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    return py::int_(row.kind == HostOptionKind::mebibytes ? bytes_to_mib(field) : field);
  } else if constexpr (is_timeout_map<T>::value) {
    return py::dict();
  } else {
    return py::cast(field);
  }
}

template <class T>
const char* python_type() {
  if constexpr (std::is_same_v<T, bool>)
    return "bool";
  else if constexpr (std::is_integral_v<T>)
    return "int";
  else if constexpr (std::is_same_v<T, std::vector<std::string>>)
    return "list[str]";
  else if constexpr (is_timeout_map<T>::value)
    return "dict[str, int]";
  else
    return "str";
}

template <class T>
py::object choices_of() {
  if constexpr (std::is_enum_v<T>) {
    return py::cast(choice_names<T>());
  } else {
    return py::none();
  }
}

const char* kind_name(HostOptionKind kind) {
  switch (kind) {
    case HostOptionKind::number: return "number";
    case HostOptionKind::per_worker: return "per_worker";
    case HostOptionKind::limit: return "limit";
    case HostOptionKind::mebibytes: return "mebibytes";
    case HostOptionKind::flag: return "flag";
    case HostOptionKind::text: return "text";
    case HostOptionKind::path: return "path";
    case HostOptionKind::names: return "names";
    case HostOptionKind::choice: return "choice";
    case HostOptionKind::timeouts: return "timeouts";
    case HostOptionKind::environment: return "environment";
  }
  return "";
}

py::object or_none(std::string_view text, const std::string& prefix = "") {
  return text.empty() ? py::object(py::none()) : py::object(py::str(prefix + std::string(text)));
}

std::string keyword_list() {
  std::string known;
  for (const auto& row : kHostOptions) {
    if (row.python_keyword()) known += (known.empty() ? "" : ", ") + std::string(row.name);
  }
  return known;
}

}  // namespace

HostOptions host_options_from_kwargs(const py::kwargs& kwargs) {
  HostOptions options = HostOptions::from_env();
  for (const auto& item : kwargs) {
    const std::string name = py::str(item.first);
    const py::handle value = item.second;  // (a name a lambda can capture, unlike a structured binding in clang 14)
    const HostOptionInfo* row = find_host_option(name);
    if (row == nullptr || !row->python_keyword()) {
      throw py::type_error("Host() got an unexpected keyword argument '" + name + "' (options: " + keyword_list() +
                           ")");
    }
    if (value.is_none()) continue;
    visit_host_options(options, [&](const HostOptionInfo& r, auto& field) {
      if (&r == row) set_member(r, field, value);
    });
  }
  if (options.limits_need_isolation()) {
    throw ConfigError("OS limits (limit_*, no_network) apply to isolated tools: add isolation='process'");
  }
  return options;
}

void bind_host_options(py::module_& m) {
  m.def(
      "host_options",
      [] {
        py::list names;
        for (const auto& row : kHostOptions) {
          if (row.python_keyword()) names.append(py::str(std::string(row.name)));
        }
        return names;
      },
      "The keyword options Host() takes.");
  m.def(
      "host_option_table",
      [] {
        py::list table;
        HostOptions defaults;
        visit_host_options(defaults, [&](const HostOptionInfo& row, auto& field) {
          using T = std::remove_cvref_t<decltype(field)>;
          py::dict entry;
          entry["name"] = std::string(row.name);
          entry["flag"] = or_none(row.on_command_line() ? row.flag : std::string_view{}, "--");
          entry["keyword"] = row.python_keyword();
          entry["type"] = python_type<T>();
          entry["kind"] = kind_name(row.kind);
          entry["min"] = row.ranged() ? py::object(py::int_(row.min)) : py::object(py::none());
          entry["max"] = row.ranged() ? py::object(py::int_(row.max)) : py::object(py::none());
          entry["default"] = python_value(row, field);
          entry["choices"] = choices_of<T>();
          entry["env"] = or_none(row.env);
          entry["group"] = std::string(row.group);
          entry["help"] = std::string(row.help);
          table.append(entry);
        });
        return table;
      },
      "The host's options, one dict each (name, flag, keyword, type, kind, min, max, default, choices, env, "
      "group, help), from the table the command line and Host() are made from.");
}

}  // namespace machina::binding
