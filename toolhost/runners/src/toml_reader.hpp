// Reading the project's TOML files (tool manifests, the tool packs' policy) with one kind
// of error: "FILE:LINE: where: field 'x': why", and an unknown key always refused (most
// often it is a misspelt one). Internal to the core.
#pragma once

#include <machina/errors.hpp>
#include <machina/nearest_name.hpp>

#include <toml++/toml.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace machina::toml_reader {

/// Errors as "FILE:LINE: what".
struct Refuser {
  const std::string& path;
  [[noreturn]] void operator()(const toml::node& at, const std::string& why) const {
    (*this)(at.source().begin.line, why);
  }
  [[noreturn]] void operator()(std::size_t line, const std::string& why) const {
    throw ConfigError(path + ":" + std::to_string(line) + ": " + why);
  }
};

/// The document, or a refusal at the line where it stops being TOML: its column, the
/// parser's reason with the characters it names written out, and the line itself.
inline toml::table parse(std::string_view text, const Refuser& refuse) {
  try {
    return toml::parse(text, refuse.path);
  } catch (const toml::parse_error& e) {
    std::string why(e.description());
    for (const auto& [raw, plain] : {std::pair<std::string_view, std::string_view>{"'\\n'", "the end of the line"},
                                     {"'\\r'", "a carriage return"},
                                     {"'\\t'", "a tab"}}) {
      for (std::size_t at; (at = why.find(raw)) != std::string::npos;) why.replace(at, raw.size(), plain);
    }
    if (why.starts_with("Error while parsing ")) why = "in " + why.substr(20);
    const std::size_t line = e.source().begin.line;
    std::string_view rest = text;
    for (std::size_t n = 1; n < line && !rest.empty(); ++n) {
      const std::size_t end = rest.find('\n');
      rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
    }
    std::string shown(rest.substr(0, std::min(rest.find_first_of("\r\n"), std::size_t{120})));
    refuse(line, "not valid TOML at column " + std::to_string(e.source().begin.column) + ", " + why +
                     (shown.empty() ? std::string() : " (the line reads: " + shown + ")"));
  }
}

inline std::string type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a number";
    case toml::node_type::boolean: return "a boolean";
    default: return "a date or time";
  }
}

/// One table's fields, each read once by its type; `where` names the table in errors
/// ("tool 3 (AID.X.v1): ", "[shell]: ").
class TableReader {
 public:
  TableReader(const toml::table& t, const Refuser& refuse, std::string where)
      : t_(t), refuse_(refuse), line_(t.source().begin.line), where_(std::move(where)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& why) const {
    const toml::node* at = t_.get(field);
    refuse_(at != nullptr ? at->source().begin.line : line_, where() + "field '" + field + "': " + why);
  }
  const std::string& where() const { return where_; }
  void set_where(std::string where) { where_ = std::move(where); }
  std::size_t line() const { return line_; }

  const toml::node* get(const std::string& field) {
    used_.insert(field);
    return t_.get(field);
  }
  template <class T>
  const toml::value<T>* typed(const std::string& field, const char* what) {
    const toml::node* n = get(field);
    if (n == nullptr) return nullptr;
    const auto* v = n->as<T>();
    if (v == nullptr) fail(field, std::string("must be ") + what + ", not " + type_name(*n));
    return v;
  }
  std::string string(const std::string& field, bool required, std::string fallback = {}) {
    const auto* v = typed<std::string>(field, "a string");
    if (v == nullptr) {
      if (required) missing(field);
      return fallback;
    }
    return v->get();
  }
  bool boolean(const std::string& field, bool fallback) {
    const auto* v = typed<bool>(field, "a boolean");
    return v != nullptr ? v->get() : fallback;
  }
  /// A whole number from `low` to `high`.
  std::int64_t integer(const std::string& field, std::int64_t fallback, std::int64_t low, std::int64_t high) {
    const auto* v = typed<std::int64_t>(field, "an integer");
    if (v == nullptr) return fallback;
    if (v->get() < low || v->get() > high) {
      fail(field, "must be from " + std::to_string(low) + " to " + std::to_string(high));
    }
    return v->get();
  }
  std::vector<std::string> strings(const std::string& field) {
    const toml::node* n = get(field);
    std::vector<std::string> out;
    if (n == nullptr) return out;
    const auto* a = n->as_array();
    if (a == nullptr) fail(field, "must be an array of strings, not " + type_name(*n));
    for (const auto& item : *a) {
      const auto* s = item.as_string();
      if (s == nullptr) fail(field, "must be an array of strings; it holds " + type_name(item));
      out.push_back(s->get());
    }
    return out;
  }
  bool has(const std::string& field) const { return t_.get(field) != nullptr; }
  /// A required field the table lacks: refused, naming the key it holds that is most likely
  /// that field misspelt.
  [[noreturn]] void missing(const std::string& field, const std::string& why = "is required") const {
    std::vector<std::string_view> unread;
    for (const auto& [k, v] : t_) {
      if (used_.count(std::string(k.str())) == 0) unread.push_back(k.str());
    }
    const std::string near = nearest_name(field, unread);
    if (near.empty()) fail(field, why);
    refuse_(t_.get(near)->source().begin.line,
            where() + "field '" + field + "': " + why + " (is the unknown field '" + near + "' a misspelling of it?)");
  }
  /// Every key of the table was read (each field the table may hold was asked for by then):
  /// another is refused, naming the field it most likely misspells.
  void no_other_keys() const {
    for (const auto& [k, v] : t_) {
      const std::string key(k.str());
      if (used_.count(key) != 0) continue;
      const std::vector<std::string_view> known(used_.begin(), used_.end());
      const std::string near = nearest_name(key, known);
      refuse_(v.source().begin.line, where() + "unknown field '" + key + "'" +
                                         (near.empty() ? std::string() : " (did you mean '" + near + "'?)"));
    }
  }

 private:
  const toml::table& t_;
  const Refuser& refuse_;
  std::size_t line_;
  std::string where_;
  std::set<std::string> used_;
};

}  // namespace machina::toml_reader
