// See tool_manifest.hpp. toml++ (header-only, compiled into this file) reads the TOML.
#include <machina/errors.hpp>
#include <machina/schema_validator.hpp>
#include <machina/tool_manifest.hpp>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace machina {
namespace {

constexpr std::size_t kMaxManifestBytes = 16u << 20;
constexpr std::int64_t kMaxTimeoutMs = 24LL * 3600 * 1000;

/// Errors as "FILE:LINE: what".
struct Refuser {
  const std::string& path;
  [[noreturn]] void operator()(const toml::node& at, const std::string& why) const {
    (*this)(at.source().begin.line, why);
  }
  [[noreturn]] void operator()(std::size_t line, const std::string& why) const {
    throw HostError(path + ":" + std::to_string(line) + ": " + why);
  }
};

std::string type_name(const toml::node& n) {
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

/// A TOML value as JSON (dates and times have no JSON form).
nlohmann::json to_json(const toml::node& n, const Refuser& refuse, const std::string& field) {
  if (const auto* t = n.as_table()) {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [k, v] : *t) out[std::string(k.str())] = to_json(v, refuse, field);
    return out;
  }
  if (const auto* a = n.as_array()) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& v : *a) out.push_back(to_json(v, refuse, field));
    return out;
  }
  if (const auto* s = n.as_string()) return s->get();
  if (const auto* i = n.as_integer()) return i->get();
  if (const auto* f = n.as_floating_point()) return f->get();
  if (const auto* b = n.as_boolean()) return b->get();
  refuse(n, "field '" + field + "': a date or time has no JSON form");
}

class ToolReader {
 public:
  ToolReader(const toml::table& t, const Refuser& refuse, std::size_t index)
      : t_(t), refuse_(refuse), line_(t.source().begin.line), index_(index) {}

  [[noreturn]] void fail(const std::string& field, const std::string& why) const {
    const toml::node* at = t_.get(field);
    refuse_(at != nullptr ? at->source().begin.line : line_, where() + "field '" + field + "': " + why);
  }
  std::string where() const { return "tool " + std::to_string(index_) + (aid_.empty() ? "" : " (" + aid_ + ")") + ": "; }
  void set_aid(std::string aid) { aid_ = std::move(aid); }
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
      if (required) fail(field, "is required");
      return fallback;
    }
    return v->get();
  }
  bool boolean(const std::string& field, bool fallback) {
    const auto* v = typed<bool>(field, "a boolean");
    return v != nullptr ? v->get() : fallback;
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
  /// Every key of the table was read (an unknown one is most often a misspelt one).
  void no_other_keys() const {
    for (const auto& [k, v] : t_) {
      const std::string key(k.str());
      if (used_.count(key) == 0) refuse_(v.source().begin.line, where() + "unknown field '" + key + "'");
    }
  }

 private:
  const toml::table& t_;
  const Refuser& refuse_;
  std::size_t line_;
  std::size_t index_;
  std::string aid_;
  std::set<std::string> used_;
};

bool is_entry(const std::string& entry) {
  const auto colon = entry.find(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == entry.size()) return false;
  if (entry.find(':', colon + 1) != std::string::npos) return false;
  for (char c : entry) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == ':')) return false;
  }
  return true;
}

ManifestTool read_tool(ToolReader& r, const std::string& path, const std::string& root) {
  ManifestTool tool;
  tool.line = r.line();
  tool.info.plugin_path = path;
  tool.info.aid = r.string("aid", true);
  if (tool.info.aid.empty()) r.fail("aid", "must not be empty");
  for (char c : tool.info.aid) {
    if (static_cast<unsigned char>(c) < 0x20) r.fail("aid", "must not hold control characters");
  }
  r.set_aid(tool.info.aid);
  tool.info.name = r.string("name", false, tool.info.aid);
  tool.info.description = r.string("description", false);
  tool.info.deterministic = r.boolean("deterministic", false);
  tool.info.side_effects = r.strings("side_effects");
  tool.info.tags = r.strings("tags");
  if (const auto* tier = r.typed<std::int64_t>("tier", "an integer")) {
    if (tier->get() < 0 || tier->get() > 3) r.fail("tier", "must be 0..3");
    tool.info.tier = static_cast<int>(tier->get());
  }
  const auto* ms = r.typed<std::int64_t>("timeout_ms", "an integer");
  const toml::node* seconds = r.get("timeout_seconds");
  if (ms != nullptr && seconds != nullptr) r.fail("timeout_seconds", "give timeout_ms or timeout_seconds, not both");
  std::int64_t timeout = 0;
  if (ms != nullptr) timeout = ms->get();
  if (seconds != nullptr) {
    const auto s = seconds->value<double>();
    if (!s || seconds->is_boolean()) r.fail("timeout_seconds", "must be a number, not " + type_name(*seconds));
    timeout = static_cast<std::int64_t>(*s * 1000.0 + 0.5);
  }
  if (ms != nullptr || seconds != nullptr) {
    if (timeout < 1 || timeout > kMaxTimeoutMs) {
      r.fail(ms != nullptr ? "timeout_ms" : "timeout_seconds", "must be from 1 ms to 24 hours");
    }
    tool.info.default_timeout_ms = static_cast<std::uint32_t>(timeout);
  }
  if (const toml::node* schema = r.get("input_schema")) {
    if (const auto* text = schema->as_string()) {
      tool.info.input_schema = text->get();
    } else if (schema->is_table()) {
      tool.info.input_schema = to_json(*schema, Refuser{path}, "input_schema").dump();
    } else {
      r.fail("input_schema", "must be a table or a string of JSON, not " + type_name(*schema));
    }
    try {
      SchemaValidator check(tool.info.input_schema);
    } catch (const HostError& e) {
      r.fail("input_schema", e.what());
    }
  }
  if (const toml::node* g = r.get("guarantees")) {
    const auto* table = g->as_table();
    if (table == nullptr) r.fail("guarantees", "must be a table of booleans, not " + type_name(*g));
    for (const auto& [k, v] : *table) {
      const std::string name(k.str());
      const auto& known = known_guarantees();
      if (std::find(known.begin(), known.end(), name) == known.end()) r.fail("guarantees", "unknown guarantee '" + name + "'");
      if (!v.is_boolean()) r.fail("guarantees", "'" + name + "' must be a boolean, not " + type_name(v));
      tool.guarantees[name] = *v.value<bool>();
    }
  }
  tool.runner = r.string("runner", true);
  tool.root = root;
  if (tool.runner == "python") {
    tool.entry = r.string("entry", true);
    if (!is_entry(tool.entry)) r.fail("entry", "must be 'module:function' (dotted names), not '" + tool.entry + "'");
    tool.python = r.string("python", false, "python3");
    if (tool.python.empty()) r.fail("python", "must not be empty");
    tool.sandbox = r.boolean("sandbox", false);
    if (const auto* n = r.typed<std::int64_t>("workers", "an integer")) {
      if (n->get() < 1 || n->get() > 256) r.fail("workers", "must be 1..256");
      tool.workers = static_cast<std::size_t>(n->get());
    }
    if (const auto* n = r.typed<std::int64_t>("memory_mb", "an integer")) {
      if (n->get() < 16 || n->get() > (1 << 20)) r.fail("memory_mb", "must be 16..1048576");
      tool.memory_mb = static_cast<std::uint64_t>(n->get());
    }
    tool.env = r.strings("env");
    for (const auto& name : tool.env) {
      if (name.empty() || name.find('=') != std::string::npos) r.fail("env", "'" + name + "' is not a variable name");
    }
    auto absolute = [&](const std::string& field, const std::string& p) {
      if (p.empty()) r.fail(field, "must not hold an empty path");
      return std::filesystem::path(p).is_absolute() ? std::filesystem::path(p).lexically_normal().string()
                                                    : (std::filesystem::path(root) / p).lexically_normal().string();
    };
    for (const auto& p : r.strings("filesystem_read_roots")) tool.read_roots.push_back(absolute("filesystem_read_roots", p));
    if (const toml::node* w = r.get("filesystem_root")) {
      if (!w->is_string()) r.fail("filesystem_root", "must be a string, not " + type_name(*w));
      tool.write_root = absolute("filesystem_root", *w->value<std::string>());
    }
  } else if (tool.runner == "service") {
    tool.url = r.string("url", true);
    if (tool.url.rfind("http://", 0) != 0 && tool.url.rfind("https://", 0) != 0) {
      r.fail("url", "must start with http:// or https://");
    }
    tool.unsafe_override = r.boolean("unsafe_override", false);
    tool.token_env = r.string("token_env", false);
    tool.entry = r.string("entry", false);
  } else if (tool.runner == "skill" || tool.runner == "mcp") {
    r.fail("runner", "'" + tool.runner + "' tools are not supported by this build yet");
  } else {
    r.fail("runner", "must be \"python\" or \"service\", not '" + tool.runner + "'");
  }
  r.no_other_keys();
  return tool;
}

}  // namespace

const std::vector<std::string>& known_guarantees() {
  static const std::vector<std::string> names = {"no_network",      "no_filesystem_write", "no_filesystem_read",
                                                 "no_subprocess",   "no_env_read",         "no_env_write"};
  return names;
}

ToolManifest parse_tool_manifest(std::string_view text, const std::string& path) {
  const Refuser refuse{path};
  toml::table doc;
  try {
    doc = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    refuse(e.source().begin.line, std::string(e.description()));
  }
  ToolManifest manifest;
  manifest.path = path;
  const std::string root = std::filesystem::absolute(std::filesystem::path(path)).parent_path().string();
  for (const auto& [k, v] : doc) {
    if (k.str() != "tool") refuse(v, "unknown top-level key '" + std::string(k.str()) + "' (tools are [[tool]] tables)");
  }
  const toml::node* tools = doc.get("tool");
  if (tools == nullptr) refuse(1, "declares no tools (no [[tool]] table)");
  const auto* list = tools->as_array();
  if (list == nullptr || !list->is_array_of_tables()) refuse(*tools, "'tool' must be an array of tables ([[tool]])");
  std::set<std::string> aids;
  std::size_t index = 0;
  for (const auto& node : *list) {
    ToolReader reader(*node.as_table(), refuse, ++index);
    ManifestTool tool = read_tool(reader, path, root);
    if (!aids.insert(tool.info.aid).second) reader.fail("aid", "'" + tool.info.aid + "' is declared twice in this file");
    manifest.tools.push_back(std::move(tool));
  }
  return manifest;
}

ToolManifest load_tool_manifest(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw HostError(path + ": cannot open the tool manifest");
  std::string text(kMaxManifestBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > kMaxManifestBytes) {
    throw HostError(path + ": the tool manifest is larger than " + std::to_string(kMaxManifestBytes) + " bytes");
  }
  return parse_tool_manifest(text, path);
}

}  // namespace machina
