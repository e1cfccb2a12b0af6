// See tool_manifest.hpp. toml++ (header-only, compiled into this file) reads the TOML.
#include <machina/errors.hpp>
#include <machina/pack_manifest.hpp>
#include <machina/runners/container_runner.hpp>
#include <machina/runners/skill_environment.hpp>
#include <machina/schema_validator.hpp>
#include <machina/tool_manifest.hpp>

#include "toml_reader.hpp"

#include <toml++/toml.h>
#include <nlohmann/json.hpp>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <set>
#include <sstream>

namespace machina {
namespace {

constexpr std::size_t kMaxManifestBytes = 16u << 20;
constexpr std::int64_t kMaxTimeoutMs = 24LL * 3600 * 1000;
constexpr std::uint32_t kPythonToolTimeoutMs = 10'000;  // tool protocol v1's deadline of a Python tool

using toml_reader::Refuser;
using toml_reader::type_name;

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

/// A [[tool]], [[skill]] or [[mcp_server]] table, named in errors by its place and aid.
class ToolReader : public toml_reader::TableReader {
 public:
  ToolReader(const toml::table& t, const Refuser& refuse, std::size_t index, std::string kind = "tool")
      : TableReader(t, refuse, kind + " " + std::to_string(index) + ": "), index_(index), kind_(std::move(kind)) {}
  void set_aid(const std::string& aid) {
    set_where(kind_ + " " + std::to_string(index_) + (aid.empty() ? "" : " (" + aid + ")") + ": ");
  }

 private:
  std::size_t index_;
  std::string kind_;
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

/// A path of the manifest's, absolute (relative ones from the manifest's directory).
std::string absolute_path(ToolReader& r, const std::string& field, const std::string& p, const std::string& root) {
  if (p.empty()) r.fail(field, "must not hold an empty path");
  return std::filesystem::path(p).is_absolute() ? std::filesystem::path(p).lexically_normal().string()
                                                : (std::filesystem::path(root) / p).lexically_normal().string();
}

/// The fields every kind of entry has for its tools' metadata and their deadline.
/// A table's deadline, `timeout_ms` or `timeout_seconds` (one of the two); 0 when it gives none.
std::uint32_t read_timeout(toml_reader::TableReader& r) {
  const auto* ms = r.typed<std::int64_t>("timeout_ms", "an integer");
  const toml::node* seconds = r.get("timeout_seconds");
  if (ms != nullptr && seconds != nullptr) r.fail("timeout_seconds", "give timeout_ms or timeout_seconds, not both");
  if (ms == nullptr && seconds == nullptr) return 0;
  std::int64_t timeout = 0;
  if (ms != nullptr) timeout = ms->get();
  if (seconds != nullptr) {
    const auto s = seconds->value<double>();
    if (!s || seconds->is_boolean()) r.fail("timeout_seconds", "must be a number, not " + type_name(*seconds));
    timeout = static_cast<std::int64_t>(*s * 1000.0 + 0.5);
  }
  if (timeout < 1 || timeout > kMaxTimeoutMs) {
    r.fail(ms != nullptr ? "timeout_ms" : "timeout_seconds", "must be from 1 ms to 24 hours");
  }
  return static_cast<std::uint32_t>(timeout);
}

void read_metadata(ToolReader& r, ToolInfo& info) {
  info.deterministic = r.boolean("deterministic", false);
  info.side_effects = r.strings("side_effects");
  info.tags = r.strings("tags");
  if (const auto* tier = r.typed<std::int64_t>("tier", "an integer")) {
    if (tier->get() < 0 || tier->get() > 3) r.fail("tier", "must be 0..3");
    info.tier = static_cast<int>(tier->get());
  }
  info.default_timeout_ms = read_timeout(r);
}

void read_guarantees(ToolReader& r, std::map<std::string, bool>& guarantees) {
  if (const toml::node* g = r.get("guarantees")) {
    const auto* table = g->as_table();
    if (table == nullptr) r.fail("guarantees", "must be a table of booleans, not " + type_name(*g));
    for (const auto& [k, v] : *table) {
      const std::string name(k.str());
      const auto& known = known_guarantees();
      if (std::find(known.begin(), known.end(), name) == known.end())
        r.fail("guarantees", "unknown guarantee '" + name + "'");
      if (!v.is_boolean()) r.fail("guarantees", "'" + name + "' must be a boolean, not " + type_name(v));
      guarantees[name] = *v.value<bool>();
    }
  }
}

/// A process's memory limit in MiB (`memory_mb`), left as it is when not given.
void read_memory_mb(ToolReader& r, std::uint64_t& memory_mb) {
  if (const auto* n = r.typed<std::int64_t>("memory_mb", "an integer")) {
    if (n->get() < 16 || n->get() > (1 << 20)) r.fail("memory_mb", "must be 16..1048576");
    memory_mb = static_cast<std::uint64_t>(n->get());
  }
}

/// The capability guarantees and the limits of a process an entry runs (a Python tool's
/// workers, a skill, an MCP server).
void read_confinement(ToolReader& r, std::map<std::string, bool>& guarantees, bool& sandbox, std::uint64_t& memory_mb,
                      std::vector<std::string>& env, std::vector<std::string>& read_roots, std::string& write_root,
                      const std::string& root) {
  read_guarantees(r, guarantees);
  sandbox = r.boolean("sandbox", false);
  read_memory_mb(r, memory_mb);
  env = r.strings("env");
  for (const auto& name : env) {
    if (name.empty() || name.find('=') != std::string::npos) r.fail("env", "'" + name + "' is not a variable name");
  }
  for (const auto& p : r.strings("filesystem_read_roots")) {
    read_roots.push_back(absolute_path(r, "filesystem_read_roots", p, root));
  }
  if (const toml::node* w = r.get("filesystem_root")) {
    if (!w->is_string()) r.fail("filesystem_root", "must be a string, not " + type_name(*w));
    write_root = absolute_path(r, "filesystem_root", *w->value<std::string>(), root);
  }
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
  read_metadata(r, tool.info);
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
    } catch (const ConfigError& e) {
      r.fail("input_schema", e.what());
    }
  }
  tool.runner = r.string("runner", true);
  tool.root = root;
  if (tool.runner == "python") {
    tool.deps_source = deps_source_of(root);
    tool.entry = r.string("entry", true);
    if (!is_entry(tool.entry)) r.fail("entry", "must be 'module:function' (dotted names), not '" + tool.entry + "'");
    tool.python = r.string("python", false, "python3");
    if (tool.python.empty()) r.fail("python", "must not be empty");
    if (const auto* n = r.typed<std::int64_t>("workers", "an integer")) {
      if (n->get() < 1 || n->get() > 256) r.fail("workers", "must be 1..256");
      tool.workers = static_cast<std::size_t>(n->get());
    }
    read_confinement(r, tool.guarantees, tool.sandbox, tool.memory_mb, tool.env, tool.read_roots, tool.write_root,
                     root);
  } else if (tool.runner == "service") {
    tool.url = r.string("url", true);
    if (tool.url.rfind("http://", 0) != 0 && tool.url.rfind("https://", 0) != 0) {
      r.fail("url", "must start with http:// or https://");
    }
    tool.unsafe_override = r.boolean("unsafe_override", false);
    tool.token_env = r.string("token_env", false);
    if (const toml::node* ca = r.get("ca_file")) {
      if (!ca->is_string()) r.fail("ca_file", "must be a string, not " + type_name(*ca));
      if (tool.url.rfind("https://", 0) != 0) r.fail("ca_file", "only an https:// URL has certificates to verify");
      tool.ca_file = absolute_path(r, "ca_file", *ca->value<std::string>(), root);
    }
    tool.entry = r.string("entry", false);
    read_guarantees(r, tool.guarantees);
  } else if (tool.runner == "container") {
    tool.deps_source = deps_source_of(root);
    tool.entry = r.string("entry", true);
    if (!is_entry(tool.entry)) r.fail("entry", "must be 'module:function' (dotted names), not '" + tool.entry + "'");
    tool.image = r.string("image", true);
    if (tool.image.empty()) r.fail("image", "must not be empty");
    if (r.get("command") != nullptr) {
      tool.command = r.strings("command");
      if (tool.command.empty()) r.fail("command", "must name a program (leave it out for the protocol's runner)");
      for (const auto& word : tool.command) {
        if (word.find('\0') != std::string::npos) r.fail("command", "must not hold a NUL character");
      }
    }
    tool.container_runtime = r.string("container_runtime", false);
    if (!tool.container_runtime.empty() && tool.container_runtime != "podman" && tool.container_runtime != "docker")
      r.fail("container_runtime", "must be \"podman\" or \"docker\", not '" + tool.container_runtime + "'");
    if (const toml::node* e = r.get("container_env")) {
      const auto* table = e->as_table();
      if (table == nullptr) r.fail("container_env", "must be a table of strings, not " + type_name(*e));
      for (const auto& [k, v] : *table) {
        if (const std::string why = container_variable_problem(std::string(k.str())); !why.empty())
          r.fail("container_env", why);
        if (!v.is_string())
          r.fail("container_env", "'" + std::string(k.str()) + "' must be a string, not " + type_name(v));
        if (v.value<std::string>()->find('\0') != std::string::npos)
          r.fail("container_env", "'" + std::string(k.str()) + "' must not hold a NUL character");
        tool.container_env.emplace_back(std::string(k.str()), *v.value<std::string>());
      }
    }
    read_guarantees(r, tool.guarantees);
    read_memory_mb(r, tool.memory_mb);
  } else if (tool.runner == "skill" || tool.runner == "mcp") {
    r.fail("runner",
           "a skill or an MCP server is declared with its own table, [[skill]] or [[mcp_server]], "
           "not as a [[tool]]");
  } else {
    r.fail("runner", "must be \"python\", \"service\" or \"container\", not '" + tool.runner + "'");
  }
  r.no_other_keys();
  return tool;
}

/// What a skill directory's manifest.json says of how to start it (a lifecycle skill's
/// {"runtime": {"type": "subprocess", "command", "args"}}, or a runtime skill's
/// {"runtime": "python", "entry", "tick_interval", "env"}), and SKILL.md's name and
/// description. Its `env` is only a request (ManifestChild::skill_env).
void read_skill_dir(ManifestChild& c, const std::string& dir, const std::function<void(const std::string&)>& fail) {
  namespace fs = std::filesystem;
  std::ifstream in(fs::path(dir) / "manifest.json", std::ios::binary);
  if (!in) return fail("no manifest.json in the skill directory " + dir);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object()) return fail(dir + "/manifest.json is not a JSON object");
  c.skill_manifest_json = j.dump();
  std::error_code exists_error;
  c.skill_requirements = fs::is_regular_file(fs::path(dir) / kSkillRequirementsFile, exists_error);
  const auto& runtime = j.contains("runtime") ? j["runtime"] : nlohmann::json();
  if (runtime.is_object()) {
    if (!runtime.contains("command") || !runtime["command"].is_string())
      return fail(dir + "/manifest.json: runtime.command must be a string");
    if (c.command.empty()) {
      c.command.push_back(runtime["command"].get<std::string>());
      if (runtime.contains("args")) {
        if (!runtime["args"].is_array()) return fail(dir + "/manifest.json: runtime.args must be an array of strings");
        for (const auto& a : runtime["args"]) {
          if (!a.is_string()) return fail(dir + "/manifest.json: runtime.args must be an array of strings");
          c.command.push_back(a.get<std::string>());
        }
      }
    }
  } else if (runtime.is_string() && runtime.get<std::string>() == "python") {
    if (!j.contains("entry") || !j["entry"].is_string()) return fail(dir + "/manifest.json: entry must be a string");
    if (c.command.empty()) c.command = {"python3", j["entry"].get<std::string>()};
    c.methods = "skill";
    // What the skill asks for: the operator's `env` alone passes variables (a skill does
    // not pick the host's secrets for itself).
    if (j.contains("env") && j["env"].is_array()) {
      for (const auto& e : j["env"]) {
        if (e.is_string()) c.skill_env.push_back(e.get<std::string>());
      }
    }
  } else if (c.command.empty()) {
    return fail(dir + "/manifest.json names no runtime to start");
  }
  if (c.tick_interval_ms < 0 && j.contains("tick_interval")) {  // (the operator's tick_interval_ms comes first)
    const auto& t = j["tick_interval"];
    if (!t.is_number_integer() || t.get<std::int64_t>() < 0 || t.get<std::int64_t>() > kMaxTimeoutMs)
      return fail(dir + "/manifest.json: tick_interval must be from 0 (no ticks) to 86400000 milliseconds");
    c.tick_interval_ms = t.get<std::int64_t>();
  }
  if (c.name.empty() && j.contains("name") && j["name"].is_string()) c.name = j["name"].get<std::string>();
  std::ifstream md(fs::path(dir) / "SKILL.md", std::ios::binary);
  if (!md) return fail("no SKILL.md in the skill directory " + dir);
  // Its front matter (between --- lines) may name the skill and say what it does.
  std::string line;
  bool front = false;
  for (int n = 0; std::getline(md, line) && n < 200; ++n) {
    if (line == "---") {
      if (front) break;
      front = n == 0;
      continue;
    }
    if (!front) break;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon), value = line.substr(colon + 1);
    while (!value.empty() && value.front() == ' ') value.erase(0, 1);
    if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') && value.back() == value.front())
      value = value.substr(1, value.size() - 2);
    if (key == "name" && c.name.empty()) c.name = value;
    if (key == "description" && c.description.empty()) c.description = value;
  }
  if (c.name.empty()) c.name = fs::path(dir).filename().string();
}

/// The fields of an MCP server reached by its URL (no command, no walls: it runs elsewhere).
void read_remote_server(ToolReader& r, ManifestChild& c, const std::string& root) {
  c.url = r.string("url", true);
  if (c.url.rfind("http://", 0) != 0 && c.url.rfind("https://", 0) != 0)
    r.fail("url", "must start with http:// or https://");
  c.description = r.string("description", false);
  c.token_env = r.string("token_env", false);
  if (const toml::node* ca = r.get("ca_file")) {
    if (!ca->is_string()) r.fail("ca_file", "must be a string, not " + type_name(*ca));
    if (c.url.rfind("https://", 0) != 0) r.fail("ca_file", "only an https:// URL has certificates to verify");
    c.ca_file = absolute_path(r, "ca_file", *ca->value<std::string>(), root);
  }
  if (const toml::node* h = r.get("headers")) {
    const auto* table = h->as_table();
    if (table == nullptr) r.fail("headers", "must be a table of strings, not " + type_name(*h));
    for (const auto& [k, v] : *table) {
      const std::string name(k.str());
      if (!v.is_string()) r.fail("headers", "'" + name + "' must be a string, not " + type_name(v));
      const std::string value = *v.value<std::string>();
      const bool name_ok = !name.empty() && std::all_of(name.begin(), name.end(), [](unsigned char ch) {
        return std::isalnum(ch) != 0 || ch == '-' || ch == '_';
      });
      if (!name_ok) r.fail("headers", "'" + name + "' is not a header name (letters, digits, '-' and '_')");
      std::string lower = name;
      std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char ch) { return std::tolower(ch); });
      for (const char* own : {"host", "accept", "content-type", "content-length", "transfer-encoding", "connection",
                              "mcp-session-id", "mcp-protocol-version"})
        if (lower == own) r.fail("headers", "'" + name + "' is set by the host itself");
      if (lower == "authorization" && !c.token_env.empty())
        r.fail("headers", "'" + name + "' is what token_env sets: give one of them");
      if (std::any_of(value.begin(), value.end(), [](unsigned char ch) { return ch < 0x20 || ch == 0x7f; }))
        r.fail("headers", "the value of '" + name + "' must be one line without control characters");
      c.headers.emplace_back(name, value);
    }
  }
  c.aid_prefix = r.string("aid_prefix", false);
  if (const auto* n = r.typed<std::int64_t>("start_timeout_ms", "an integer")) {
    if (n->get() < 1 || n->get() > kMaxTimeoutMs) r.fail("start_timeout_ms", "must be from 1 ms to 24 hours");
    c.start_timeout_ms = n->get();
  }
  read_metadata(r, c.defaults);
  r.no_other_keys();
  for (char ch : c.name) {
    if (static_cast<unsigned char>(ch) < 0x20) r.fail("name", "must not hold control characters");
  }
  c.dir = root;
}

ManifestChild read_child(ToolReader& r, const std::string& kind, const std::string& root) {
  ManifestChild c;
  c.kind = kind;
  c.line = r.line();
  c.name = r.string("name", kind == "mcp_server");
  r.set_aid(c.name);
  if (kind == "mcp_server" && r.get("url") != nullptr) {
    if (r.get("command") != nullptr) r.fail("url", "give command (a server started here) or url, not both");
    read_remote_server(r, c, root);
    return c;
  }
  c.command = r.strings("command");
  c.description = r.string("description", false);
  if (const toml::node* d = r.get("dir")) {
    if (!d->is_string()) r.fail("dir", "must be a string, not " + type_name(*d));
    c.dir = absolute_path(r, "dir", *d->value<std::string>(), root);
  }
  if (kind == "skill") {
    c.methods = r.string("methods", false, "lifecycle");
    if (c.methods != "lifecycle" && c.methods != "skill")
      r.fail("methods", "must be \"lifecycle\" (lifecycle/*) or \"skill\" (skill/*), not '" + c.methods + "'" +
                            (c.methods == "seed" ? "; \"seed\" is spelled \"lifecycle\"" : ""));
    if (const auto* n = r.typed<std::int64_t>("tick_interval_ms", "an integer")) {
      if (n->get() < 0 || n->get() > kMaxTimeoutMs) r.fail("tick_interval_ms", "must be from 0 (no ticks) to 24 hours");
      c.tick_interval_ms = n->get();
    }
    if (const toml::node* d = r.get("data_dir")) {
      if (!d->is_string()) r.fail("data_dir", "must be a string, not " + type_name(*d));
      c.data_dir = absolute_path(r, "data_dir", *d->value<std::string>(), root);
    }
  }
  c.aid_prefix = r.string("aid_prefix", false);
  if (const auto* n = r.typed<std::int64_t>("start_timeout_ms", "an integer")) {
    if (n->get() < 1 || n->get() > kMaxTimeoutMs) r.fail("start_timeout_ms", "must be from 1 ms to 24 hours");
    c.start_timeout_ms = n->get();
  }
  read_metadata(r, c.defaults);
  std::vector<std::string> read_roots;
  read_confinement(r, c.guarantees, c.sandbox, c.memory_mb, c.env, read_roots, c.write_root, root);
  if (!read_roots.empty())
    r.fail("filesystem_read_roots", "is for Python tools (no_filesystem_read is not offered here)");
  r.no_other_keys();
  if (kind == "skill" && !c.dir.empty() && std::filesystem::exists(std::filesystem::path(c.dir) / "manifest.json")) {
    read_skill_dir(c, c.dir, [&](const std::string& why) { r.fail("dir", why); });
  }
  if (c.command.empty()) r.missing("command", "is required (the program and its arguments)");
  if (c.name.empty()) r.missing("name");
  for (char ch : c.name) {
    if (static_cast<unsigned char>(ch) < 0x20) r.fail("name", "must not hold control characters");
  }
  if (c.dir.empty()) c.dir = root;
  return c;
}

}  // namespace

const std::vector<std::string>& known_guarantees() {
  static const std::vector<std::string> names = {"no_network",    "no_filesystem_write", "no_filesystem_read",
                                                 "no_subprocess", "no_env_read",         "no_env_write"};
  return names;
}

std::string deps_source_of(const std::string& folder) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(fs::path(folder) / "pyproject.toml", ec)) return "pyproject";
  if (fs::exists(fs::path(folder) / "requirements.txt", ec)) return "requirements";
  return "none";
}

ToolManifest parse_tool_manifest(std::string_view text, const std::string& path) {
  const Refuser refuse{path};
  const toml::table doc = toml_reader::parse(text, refuse);
  ToolManifest manifest;
  manifest.path = path;
  const std::string root = std::filesystem::absolute(std::filesystem::path(path)).parent_path().string();
  for (const auto& [k, v] : doc) {
    if (k.str() != "tool" && k.str() != "skill" && k.str() != "mcp_server" && k.str() != "defaults")
      refuse(v, "unknown top-level key '" + std::string(k.str()) +
                    "' (tables are [defaults], [[tool]], [[skill]], [[mcp_server]])");
  }
  // The deadline of the file's tools that name none of their own.
  std::uint32_t default_timeout_ms = 0;
  if (const toml::node* d = doc.get("defaults")) {
    if (!d->is_table()) refuse(*d, "'defaults' must be a table ([defaults])");
    toml_reader::TableReader defaults(*d->as_table(), refuse, "[defaults]: ");
    default_timeout_ms = read_timeout(defaults);
    defaults.no_other_keys();
  }
  if (doc.get("tool") == nullptr && doc.get("skill") == nullptr && doc.get("mcp_server") == nullptr)
    refuse(1, "declares no tools (no [[tool]], [[skill]] or [[mcp_server]] table)");
  auto tables = [&](const char* key) -> const toml::array* {
    const toml::node* n = doc.get(key);
    if (n == nullptr) return nullptr;
    const auto* list = n->as_array();
    if (list == nullptr || !list->is_array_of_tables())
      refuse(*n, "'" + std::string(key) + "' must be an array of tables ([[" + key + "]])");
    return list;
  };
  std::set<std::string> aids;
  std::size_t index = 0;
  if (const auto* list = tables("tool")) {
    for (const auto& node : *list) {
      ToolReader reader(*node.as_table(), refuse, ++index);
      ManifestTool tool = read_tool(reader, path, root);
      if (tool.info.default_timeout_ms == 0) {
        tool.info.default_timeout_ms = default_timeout_ms != 0    ? default_timeout_ms
                                       : tool.runner != "service" ? kPythonToolTimeoutMs
                                                                  : 0;
      }
      if (!aids.insert(tool.info.aid).second)
        reader.fail("aid", "'" + tool.info.aid + "' is declared twice in this file");
      manifest.tools.push_back(std::move(tool));
    }
  }
  std::set<std::string> names;
  for (const char* kind : {"skill", "mcp_server"}) {
    index = 0;
    if (const auto* list = tables(kind)) {
      for (const auto& node : *list) {
        ToolReader reader(*node.as_table(), refuse, ++index, kind);
        ManifestChild child = read_child(reader, kind, root);
        if (!names.insert(child.name).second)
          reader.fail("name", "'" + child.name + "' is declared twice in this file");
        manifest.children.push_back(std::move(child));
      }
    }
  }
  return manifest;
}

ToolManifest load_tool_manifest(const std::string& path) {
  if (std::filesystem::is_directory(path) && is_pack_dir(path)) return load_pack_dir(path);  // a namel3ss pack
  if (std::filesystem::is_directory(path)) {  // a skill directory (manifest.json, SKILL.md)
    ToolManifest manifest;
    manifest.path = path;
    ManifestChild c;
    c.kind = "skill";
    c.line = 1;
    c.dir = std::filesystem::absolute(path).lexically_normal().string();
    read_skill_dir(c, c.dir, [&](const std::string& why) { throw ConfigError(path + ": " + why); });
    manifest.children.push_back(std::move(c));
    return manifest;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot open the tool manifest");
  std::string text(kMaxManifestBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > kMaxManifestBytes) {
    throw ConfigError(path + ": the tool manifest is larger than " + std::to_string(kMaxManifestBytes) + " bytes");
  }
  return parse_tool_manifest(text, path);
}

}  // namespace machina
