// See pack_manifest.hpp. yaml-cpp reads the YAML; every field is checked here.
#include <machina/aid_word.hpp>
#include <machina/errors.hpp>
#include <machina/pack_manifest.hpp>
#include <machina/runners/container_runner.hpp>

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

namespace machina {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t kMaxPackFileBytes = 1u << 20;
constexpr std::uint32_t kPythonToolTimeoutMs = 10'000;  // tool protocol v1's deadline of a Python tool
constexpr std::int64_t kMaxTimeoutMs = 24LL * 3600 * 1000;

/// One YAML file of the pack, naming itself (and a node's line) in errors.
class PackFile {
 public:
  PackFile(const fs::path& dir, const char* name) : path_((dir / name).string()) {}

  bool exists() const { return fs::is_regular_file(path_); }
  const std::string& path() const { return path_; }

  /// Its top-level mapping. Throws "FILE:LINE: …" on bad YAML.
  YAML::Node load() const {
    std::ifstream in(path_, std::ios::binary);
    if (!in) throw ConfigError(path_ + ": cannot be read");
    std::string text(kMaxPackFileBytes + 1, '\0');
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<std::size_t>(in.gcount()));
    if (text.size() > kMaxPackFileBytes) {
      throw ConfigError(path_ + ": larger than " + std::to_string(kMaxPackFileBytes) + " bytes");
    }
    YAML::Node doc;
    try {
      doc = YAML::Load(text);
    } catch (const YAML::DeepRecursion& e) {
      throw ConfigError(path_ + ":" + std::to_string(e.mark.line + 1) + ": not valid YAML: nested too deep (" +
                        std::to_string(e.depth()) + " levels)");
    } catch (const YAML::Exception& e) {
      throw ConfigError(path_ + ":" + std::to_string(e.mark.line + 1) + ": not valid YAML: " + e.msg);
    }
    if (!doc.IsMap()) throw ConfigError(path_ + ": must be a mapping of keys to values");
    return doc;
  }

  [[noreturn]] void fail(const YAML::Node& at, const std::string& what) const {
    const int line = at.IsDefined() ? at.Mark().line : -1;
    throw ConfigError(path_ + (line >= 0 ? ":" + std::to_string(line + 1) : std::string()) + ": " + what);
  }

 private:
  std::string path_;
};

std::string kind_of(const YAML::Node& n) {
  return n.IsMap() ? "a mapping" : n.IsSequence() ? "a list" : n.IsNull() ? "empty" : "a scalar";
}

/// A text field ("" when absent and not required).
std::string text(const PackFile& f, const YAML::Node& map, const char* key, const std::string& where, bool required) {
  const YAML::Node n = map[key];
  if (!n.IsDefined() || n.IsNull()) {
    if (required) f.fail(YAML::Node(), where + "field '" + key + "': is required");
    return {};
  }
  if (!n.IsScalar()) f.fail(n, where + "field '" + key + "': must be text, not " + kind_of(n));
  return n.Scalar();
}

/// One of `levels`, and whether it is the first ("none").
bool level_none(const PackFile& f, const YAML::Node& map, const char* key, const std::string& where,
                const std::vector<std::string>& levels) {
  const std::string value = text(f, map, key, where, true);
  if (std::find(levels.begin(), levels.end(), value) == levels.end()) {
    std::string list;
    for (const auto& l : levels) list += (list.empty() ? "" : ", ") + l;
    f.fail(map[key], where + "field '" + key + "': must be one of " + list + ", not '" + value + "'");
  }
  return value == levels.front();
}

/// capabilities.yaml: the guarantees of each tool, and the variables it may read (secrets).
/// filesystem none: no_filesystem_read and no_filesystem_write; read: no_filesystem_write;
/// network none: no_network; subprocess none: no_subprocess; env none: no_env_read (unless
/// it names secrets, which its workers then get).
void read_capabilities(const PackFile& f, const std::set<std::string>& tools,
                       std::map<std::string, ManifestTool*>& by_name) {
  const YAML::Node doc = f.load();
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (it->first.Scalar() != "capabilities")
      f.fail(it->first, "unknown key '" + it->first.Scalar() + "' (capabilities: is the only one)");
  }
  const YAML::Node caps = doc["capabilities"];
  if (!caps.IsDefined() || caps.IsNull()) return;
  if (!caps.IsMap()) f.fail(caps, "'capabilities' must be a mapping of tool names, not " + kind_of(caps));
  for (auto it = caps.begin(); it != caps.end(); ++it) {
    const std::string name = it->first.Scalar();
    const std::string where = "tool '" + name + "': ";
    if (tools.count(name) == 0) f.fail(it->first, where + "is not one of the tools pack.yaml lists");
    const YAML::Node c = it->second;  // (a copy: the iterator hands out a temporary)
    if (!c.IsMap())
      f.fail(c, where + "must be a mapping (filesystem, network, env, subprocess, secrets), not " + kind_of(c));
    for (auto k = c.begin(); k != c.end(); ++k) {
      static const std::set<std::string> known = {"filesystem", "network", "env", "subprocess", "secrets"};
      if (known.count(k->first.Scalar()) == 0) {
        f.fail(k->first, where + "unknown field '" + k->first.Scalar() +
                             "' (fields are filesystem, network, env, subprocess, secrets)");
      }
    }
    ManifestTool& t = *by_name.at(name);
    const std::string fs_level = text(f, c, "filesystem", where, true);
    if (fs_level != "none" && fs_level != "read" && fs_level != "write") {
      f.fail(c["filesystem"], where + "field 'filesystem': must be one of none, read, write, not '" + fs_level + "'");
    }
    if (fs_level != "write") t.guarantees["no_filesystem_write"] = true;
    if (fs_level == "none") t.guarantees["no_filesystem_read"] = true;
    if (level_none(f, c, "network", where, {"none", "outbound"})) t.guarantees["no_network"] = true;
    if (level_none(f, c, "subprocess", where, {"none", "allow"})) t.guarantees["no_subprocess"] = true;
    const bool env_none = level_none(f, c, "env", where, {"none", "read"});
    if (const YAML::Node s = c["secrets"]; s.IsDefined() && !s.IsNull()) {
      if (!s.IsSequence()) f.fail(s, where + "field 'secrets': must be a list of variable names, not " + kind_of(s));
      for (const auto& v : s) {
        if (!v.IsScalar() || v.Scalar().empty() || v.Scalar().find('=') != std::string::npos) {
          f.fail(v, where + "field 'secrets': each must be a variable name");
        }
        t.env.push_back(v.Scalar());
      }
    }
    if (env_none && t.env.empty()) t.guarantees["no_env_read"] = true;
  }
}

/// Refuses a key of the mapping `map` (pack.yaml's `field`) other than `key`.
void only_keys(const PackFile& f, const YAML::Node& map, const char* field, const char* key) {
  for (auto it = map.begin(); it != map.end(); ++it) {
    if (it->first.Scalar() != key) {
      f.fail(it->first, std::string("field '") + field + "': unknown key '" + it->first.Scalar() + "' (" + key +
                            ": is the only one)");
    }
  }
}

/// What pack.yaml gives its tools' bindings unless they say.
struct PackDefaults {
  std::string runner;       // runners: default ("": local)
  std::string service_url;  // service_url
  std::string image;        // container: image
};

void check_runner(const PackFile& f, const YAML::Node& at, const std::string& where, const char* field,
                  const std::string& runner) {
  if (!runner.empty() && runner != "local" && runner != "service" && runner != "container") {
    f.fail(at, where + "field '" + field + "': must be one of local, service, container, not '" + runner + "'");
  }
}

/// A container image named in the pack (a binding's, or pack.yaml's container: image).
void check_image(const PackFile& f, const YAML::Node& at, const std::string& where, const char* field,
                 const std::string& image) {
  if (const std::string why = container_image_problem(image); !why.empty()) {
    f.fail(at, where + "field '" + field + "': " + why);
  }
}

void check_url(const PackFile& f, const YAML::Node& at, const std::string& where, const char* field,
               const std::string& url) {
  if (url.rfind("http://", 0) != 0 && url.rfind("https://", 0) != 0) {
    f.fail(at, where + "field '" + field + "': must start with http:// or https://");
  }
}

void read_container_binding(const PackFile& f, const YAML::Node& b, const std::string& where,
                            const PackDefaults& defaults, ManifestTool& t);

/// One tool's binding (tools.yaml's, or an entry of pack.yaml's entrypoints) onto `t`:
/// kind, entry, runner (local, service, container) and that runner's fields, purity,
/// timeout_ms, sandbox.
void read_binding(const PackFile& f, const YAML::Node& b, const std::string& where, const PackDefaults& defaults,
                  ManifestTool& t) {
  if (!b.IsMap()) f.fail(b, where + "must be a mapping (kind, entry), not " + kind_of(b));
  t.line = static_cast<std::size_t>(b.Mark().line + 1);
  for (auto k = b.begin(); k != b.end(); ++k) {
    static const std::set<std::string> known = {"kind", "entry",  "runner",     "url",     "image",      "command",
                                                "env",  "purity", "timeout_ms", "sandbox", "enforcement"};
    if (known.count(k->first.Scalar()) == 0) {
      f.fail(k->first, where + "unknown field '" + k->first.Scalar() +
                           "' (fields are kind, entry, runner, url, image, command, env, purity, timeout_ms, "
                           "sandbox, enforcement)");
    }
  }
  const std::string kind = text(f, b, "kind", where, false);
  if (!kind.empty() && kind != "python")
    f.fail(b["kind"], where + "field 'kind': must be \"python\", not '" + kind + "'");
  if (kind.empty() && b["kind"].IsDefined()) f.fail(b["kind"], where + "field 'kind': must be \"python\"");
  std::string runner = text(f, b, "runner", where, false);
  check_runner(f, b["runner"], where, "runner", runner);
  if (runner.empty()) runner = defaults.runner.empty() ? "local" : defaults.runner;
  t.entry = text(f, b, "entry", where, true);
  const auto colon = t.entry.find(':');
  const bool dotted = std::all_of(t.entry.begin(), t.entry.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == ':';
  });
  if (!dotted || colon == std::string::npos || colon == 0 || colon + 1 == t.entry.size() ||
      t.entry.find(':', colon + 1) != std::string::npos) {
    f.fail(b["entry"], where + "field 'entry': must be 'module:function' (dotted names), not '" + t.entry + "'");
  }
  const std::string purity = text(f, b, "purity", where, false);
  if (!purity.empty() && purity != "pure" && purity != "impure") {
    f.fail(b["purity"], where + "field 'purity': must be pure or impure, not '" + purity + "'");
  }
  t.info.deterministic = purity == "pure";
  t.info.default_timeout_ms = kPythonToolTimeoutMs;
  if (const YAML::Node n = b["timeout_ms"]; n.IsDefined()) {
    std::int64_t ms = 0;
    if (!n.IsScalar() || !YAML::convert<std::int64_t>::decode(n, ms) || ms < 1 || ms > kMaxTimeoutMs) {
      f.fail(n, where + "field 'timeout_ms': must be an integer from 1 ms to 24 hours");
    }
    t.info.default_timeout_ms = static_cast<std::uint32_t>(ms);
  }
  const std::string enforcement = text(f, b, "enforcement", where, false);
  if (!enforcement.empty() && enforcement != "declared" && enforcement != "verified") {
    f.fail(b["enforcement"], where + "field 'enforcement': must be declared or verified, not '" + enforcement + "'");
  }
  // Fields of another runner than the binding's would be silently unused: refused.
  auto only_for = [&](const char* field, const char* for_runner) {
    if (b[field].IsDefined() && runner != for_runner) {
      f.fail(b[field],
             where + "field '" + field + "': is for the " + for_runner + " runner; this tool's runner is " + runner);
    }
  };
  only_for("url", "service");
  for (const char* field : {"image", "command", "env", "enforcement"}) only_for(field, "container");
  if (runner == "local") {
    t.runner = "python";
    t.python = "python3";
    // The guarantees are capabilities.yaml's; `sandbox: true` adds the host's sandbox (no
    // network, no processes, no writes), which would override what capabilities.yaml allows.
    if (const YAML::Node n = b["sandbox"]; n.IsDefined()) {
      if (!n.IsScalar() || !YAML::convert<bool>::decode(n, t.sandbox)) {
        f.fail(n, where + "field 'sandbox': must be true or false");
      }
    }
    return;
  }
  if (b["sandbox"].IsDefined()) {
    f.fail(b["sandbox"], where + "field 'sandbox': is for the local runner; this tool's runner is " + runner);
  }
  if (runner == "service") {
    t.runner = "service";
    t.url = text(f, b, "url", where, false);
    if (t.url.empty()) t.url = defaults.service_url;
    if (t.url.empty()) {
      f.fail(b, where + "the service runner needs a URL: set url here or service_url in pack.yaml");
    }
    if (b["url"].IsDefined()) check_url(f, b["url"], where, "url", t.url);
    return;
  }
  read_container_binding(f, b, where, defaults, t);
}

/// A container binding's image (else pack.yaml's), command and variables.
void read_container_binding(const PackFile& f, const YAML::Node& b, const std::string& where,
                            const PackDefaults& defaults, ManifestTool& t) {
  t.runner = "container";
  t.image = text(f, b, "image", where, false);
  if (b["image"].IsDefined()) check_image(f, b["image"], where, "image", t.image);
  if (t.image.empty()) t.image = defaults.image;
  if (t.image.empty()) {
    f.fail(b, where + "the container runner needs an image: set image here or container: image in pack.yaml");
  }
  if (const YAML::Node c = b["command"]; c.IsDefined() && !c.IsNull()) {
    if (!c.IsSequence() || c.size() == 0) f.fail(c, where + "field 'command': must be a list of words");
    for (const auto& w : c) {
      if (!w.IsScalar() || w.Scalar().empty() || w.Scalar().find('\0') != std::string::npos)
        f.fail(w, where + "field 'command': each word must be text");
      t.command.push_back(w.Scalar());
    }
  }
  if (const YAML::Node e = b["env"]; e.IsDefined() && !e.IsNull()) {
    if (!e.IsMap()) f.fail(e, where + "field 'env': must be a mapping of names to values");
    for (auto v = e.begin(); v != e.end(); ++v) {
      const std::string key = v->first.Scalar();
      if (const std::string why = container_variable_problem(key); !why.empty())
        f.fail(v->first, where + "field 'env': " + why);
      if (!v->second.IsScalar() || v->second.Scalar().find('\0') != std::string::npos)
        f.fail(v->second, where + "field 'env': '" + key + "' must have a text value");
      t.container_env.emplace_back(key, v->second.Scalar());
    }
  }
}

}  // namespace

bool is_pack_dir(const std::string& dir) {
  return fs::is_regular_file(fs::path(dir) / "pack.yaml") || fs::is_regular_file(fs::path(dir) / "tools.yaml");
}

ToolManifest load_pack_dir(const std::string& dir) {
  const fs::path root = fs::absolute(dir).lexically_normal();
  const PackFile pack_file(root, "pack.yaml"), tools_file(root, "tools.yaml"), caps_file(root, "capabilities.yaml");
  if (!pack_file.exists()) {
    throw ConfigError(dir + ": no pack.yaml in the pack (a namel3ss pack holds pack.yaml and tools.yaml)");
  }

  // pack.yaml: who the pack is, which tools it offers, and its runners' defaults.
  const YAML::Node pack = pack_file.load();
  static const std::set<std::string> pack_keys = {"id",      "name",        "version",   "description", "author",
                                                  "license", "tools",       "signer_id", "signed_at",   "digest",
                                                  "runners", "service_url", "container", "entrypoints"};
  for (auto it = pack.begin(); it != pack.end(); ++it) {
    if (pack_keys.count(it->first.Scalar()) == 0) pack_file.fail(it->first, "unknown key '" + it->first.Scalar() + "'");
  }
  ManifestTool::Pack source;
  source.source = "installed_pack";
  source.id = text(pack_file, pack, "id", "", true);
  source.name = text(pack_file, pack, "name", "", true);
  source.version = text(pack_file, pack, "version", "", true);
  const std::string description = text(pack_file, pack, "description", "", true);
  for (const char* key : {"author", "license"}) text(pack_file, pack, key, "", true);
  if (source.id.empty()) pack_file.fail(pack["id"], "field 'id': must not be empty");
  PackDefaults defaults;
  if (const YAML::Node runners = pack["runners"]; runners.IsDefined() && !runners.IsNull()) {
    if (!runners.IsMap()) pack_file.fail(runners, "field 'runners': must be a mapping (default: local)");
    only_keys(pack_file, runners, "runners", "default");
    defaults.runner = text(pack_file, runners, "default", "runners: ", false);
    check_runner(pack_file, runners["default"], "runners: ", "default", defaults.runner);
  }
  defaults.service_url = text(pack_file, pack, "service_url", "", false);
  if (!defaults.service_url.empty()) check_url(pack_file, pack["service_url"], "", "service_url", defaults.service_url);
  if (const YAML::Node container = pack["container"]; container.IsDefined() && !container.IsNull()) {
    if (!container.IsMap()) pack_file.fail(container, "field 'container': must be a mapping (image: ...)");
    only_keys(pack_file, container, "container", "image");
    defaults.image = text(pack_file, container, "image", "container: ", false);
    if (container["image"].IsDefined())
      check_image(pack_file, container["image"], "container: ", "image", defaults.image);
  }
  const YAML::Node names = pack["tools"];
  if (!names.IsDefined() || names.IsNull()) pack_file.fail(YAML::Node(), "field 'tools': is required");
  if (!names.IsSequence() || names.size() == 0) pack_file.fail(names, "field 'tools': must be a list of tool names");

  // The bindings: tools.yaml's, or else pack.yaml's entrypoints.
  const bool own_file = tools_file.exists();
  const YAML::Node entrypoints = pack["entrypoints"];  // (namel3ss reads them only without tools.yaml)
  const bool has_entrypoints = entrypoints.IsDefined() && !entrypoints.IsNull();
  if (!own_file && !has_entrypoints) {
    throw ConfigError(dir +
                      ": no tools.yaml in the pack and no entrypoints in its pack.yaml (a namel3ss pack "
                      "binds its tools in one of them)");
  }
  const PackFile& bindings_file = own_file ? tools_file : pack_file;
  const YAML::Node tools_doc = own_file ? tools_file.load() : YAML::Node();
  for (auto it = tools_doc.begin(); it != tools_doc.end(); ++it) {
    if (it->first.Scalar() != "tools")
      tools_file.fail(it->first, "unknown key '" + it->first.Scalar() + "' (tools: is the only one)");
  }
  // (A missing key's node answers IsDefined() only: anything else throws in yaml-cpp.)
  const YAML::Node bindings = own_file ? tools_doc["tools"] : entrypoints;
  if (own_file && (!bindings.IsDefined() || !bindings.IsMap()))
    tools_file.fail(bindings.IsDefined() ? bindings : tools_doc, "'tools' must be a mapping of tool names to bindings");
  if (!own_file && !bindings.IsMap())
    pack_file.fail(bindings, "field 'entrypoints': must be a mapping of tool names to bindings");
  source.bindings_path = bindings_file.path();
  const std::string binding_home = own_file ? "tools.yaml" : "pack.yaml's entrypoints";

  ToolManifest manifest;
  manifest.path = root.string();
  std::set<std::string> listed, aids;
  for (const auto& n : names) {
    if (!n.IsScalar() || n.Scalar().empty()) pack_file.fail(n, "field 'tools': each must be a tool's name");
    const std::string name = n.Scalar();
    if (!listed.insert(name).second) pack_file.fail(n, "field 'tools': '" + name + "' is listed twice");
    if (!bindings[name].IsDefined()) {
      pack_file.fail(n, "the tool '" + name + "' has no binding in " + binding_home + " (add \"" + name +
                            "\": {kind: \"python\", entry: \"tools.module:function\"})");
    }
  }
  const std::string deps_source = deps_source_of(root.string());
  for (auto it = bindings.begin(); it != bindings.end(); ++it) {
    const std::string name = it->first.Scalar();
    const std::string where = "tool '" + name + "': ";
    if (listed.count(name) == 0) bindings_file.fail(it->first, where + "is not one of the tools pack.yaml lists");
    ManifestTool t;
    t.pack = source;
    t.info.aid = "AID.PACK." + aid_word(source.id) + "." + aid_word(name) + ".v1";
    t.info.name = name;
    t.info.description = description;
    t.info.plugin_path = manifest.path;
    if (!aids.insert(t.info.aid).second) {
      bindings_file.fail(it->first, where + "its aid " + t.info.aid + " is another tool's of this pack too");
    }
    read_binding(bindings_file, it->second, where, defaults, t);
    t.root = manifest.path;
    t.deps_source = deps_source;
    manifest.tools.push_back(std::move(t));
  }

  std::map<std::string, ManifestTool*> by_name;
  for (auto& t : manifest.tools) by_name[t.info.name] = &t;
  if (caps_file.exists()) read_capabilities(caps_file, listed, by_name);
  return manifest;
}

}  // namespace machina
