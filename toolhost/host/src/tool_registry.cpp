// Tool registration (through the C ABI, or from descriptions); see tool_registry.hpp.
// Loading plugin libraries is in plugin_library.cpp.
#include <machina/errors.hpp>
#include <machina/tool_registry.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <mutex>
#include <set>

namespace machina {
namespace {

/// Registration state handed to the plugin as the opaque machina_registrar.
struct PendingRegistration {
  std::string path;
  CircuitBreaker::Options breaker_options;
  std::vector<std::unique_ptr<Tool>> tools;
  std::string error;

  void refuse(std::string why) {
    if (error.empty()) error = std::move(why);
  }
};

/// The checks every tool passes, however it is declared: a refusal reason, or empty.
std::string check_and_compile(Tool& tool, bool defer_schema) {
  const ToolInfo& info = tool.info;
  if (info.aid.empty()) return "a tool has an empty aid";
  if (info.tier < 0 || info.tier > 3) {
    return "tool " + info.aid + " has tier " + std::to_string(info.tier) + " (must be 0..3)";
  }
  try {
    tool.compile_schema(defer_schema);
  } catch (const ConfigError& e) {
    return "tool " + info.aid + ": " + e.what();
  }
  return {};
}

std::vector<std::string> copy_strings(const char* const* items, std::size_t count) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < count; ++i) {
    if (items[i] != nullptr) out.emplace_back(items[i]);
  }
  return out;
}

int add_tool(machina_registrar* registrar, const machina_tool_desc* d) {
  auto& reg = *reinterpret_cast<PendingRegistration*>(registrar);
  if (!reg.error.empty()) return -1;
  if (d == nullptr || d->struct_size < MACHINA_TOOL_DESC_MIN_SIZE) {
    reg.refuse("a tool description is missing or too small for ABI version 1");
    return -1;
  }
  constexpr std::size_t kHasTimeout = offsetof(machina_tool_desc, default_timeout_ms) + sizeof(std::uint32_t);
  const std::string aid = d->aid != nullptr ? d->aid : "";
  if (!aid.empty() && d->invoke == nullptr) {
    reg.refuse("tool " + aid + " has no invoke function");
    return -1;
  }
  auto tool = std::make_unique<Tool>(reg.breaker_options);
  ToolInfo& info = tool->info;
  info.aid = aid;
  info.name = d->name ? d->name : aid;
  info.description = d->description ? d->description : "";
  info.deterministic = d->deterministic != 0;
  info.tags = copy_strings(d->tags, d->tags ? d->tag_count : 0);
  info.side_effects = copy_strings(d->side_effects, d->side_effects ? d->side_effect_count : 0);
  info.replay_inputs = d->replay_inputs != 0;
  info.tier = d->tier;
  info.default_timeout_ms = d->struct_size >= kHasTimeout ? d->default_timeout_ms : 0;
  info.plugin_path = reg.path;
  info.input_schema = d->input_schema != nullptr ? d->input_schema : "";
  if (auto why = check_and_compile(*tool, reg.path == kLinkedPluginSource); !why.empty()) {
    reg.refuse(std::move(why));
    return -1;
  }
  tool->invoke = d->invoke;
  tool->tool_data = d->tool_data;
  reg.tools.push_back(std::move(tool));
  return 0;
}

void fail(machina_registrar* registrar, const char* message) {
  auto& reg = *reinterpret_cast<PendingRegistration*>(registrar);
  reg.refuse(message ? message : "registration failed");
}

const machina_registrar_api kRegistrarApi{MACHINA_PLUGIN_ABI_VERSION, sizeof(machina_registrar_api), &add_tool, &fail};

}  // namespace

void Tool::compile_schema(bool defer) {
  if (!defer) (void)input_validator();
}

const SchemaValidator* Tool::input_validator() const {
  if (info.input_schema.empty()) return nullptr;
  if (schema_ready_.load(std::memory_order_acquire)) return &*schema_;
  std::lock_guard lock(schema_mu_);
  if (!schema_) schema_.emplace(info.input_schema);  // a throw leaves it unset
  schema_ready_.store(true, std::memory_order_release);
  return &*schema_;
}

ToolRegistry::ToolRegistry(CircuitBreaker::Options breaker_options) : breaker_options_(breaker_options) {
  static std::atomic<std::uint64_t> next_serial{1};
  serial_ = next_serial.fetch_add(1, std::memory_order_relaxed);
}

ToolRegistry::~ToolRegistry() {
  tools_.clear();  // before the code they point into goes
  libraries_.clear();
}

std::vector<std::string> ToolRegistry::add_plugin(const std::string& source, PluginEntryPoints entry, Runner* runner) {
  const std::string where = "plugin " + source + ": ";
  auto refuse = [&](const std::string& why) { throw ConfigError(where + why); };
  const std::uint32_t version = entry.abi_version();
  if (version != MACHINA_PLUGIN_ABI_VERSION) {
    refuse("ABI version " + std::to_string(version) + " is not supported (this host speaks version " +
           std::to_string(MACHINA_PLUGIN_ABI_VERSION) + ")");
  }
  if (entry.register_tools == nullptr) refuse("missing entry point " MACHINA_PLUGIN_REGISTER_SYMBOL);
  PendingRegistration pending{source, breaker_options_, {}, {}};
  const int rc = entry.register_tools(&kRegistrarApi, reinterpret_cast<machina_registrar*>(&pending));
  if (!pending.error.empty()) refuse("registration refused: " + pending.error);
  if (rc != 0) refuse("registration failed (code " + std::to_string(rc) + ")");
  if (pending.tools.empty()) refuse("registers no tools");
  for (auto& tool : pending.tools) tool->runner = runner;
  return add("plugin " + source, std::move(pending.tools));
}

std::vector<std::string> ToolRegistry::add_described(const std::string& source, std::vector<ToolInfo> infos,
                                                     Runner* runner, bool host_own) {
  std::vector<Described> tools;
  tools.reserve(infos.size());
  for (auto& info : infos) tools.push_back({std::move(info), runner, host_own});
  return add_described(source, std::move(tools), "plugin");
}

std::vector<std::string> ToolRegistry::add_described(const std::string& source, std::vector<Described> described,
                                                     std::string_view what) {
  const std::string where = std::string(what) + " " + source;
  std::vector<std::unique_ptr<Tool>> tools;
  tools.reserve(described.size());
  const bool host_own = !described.empty() &&
                        std::all_of(described.begin(), described.end(), [](const Described& d) { return d.host_own; });
  for (auto& d : described) {
    auto tool = std::make_unique<Tool>(breaker_options_);
    tool->info = std::move(d.info);
    if (auto why = check_and_compile(*tool, d.host_own); !why.empty()) throw ConfigError(where + ": " + why);
    tool->runner = d.runner;
    tools.push_back(std::move(tool));
  }
  if (tools.empty()) throw ConfigError(where + ": registers no tools");
  return add(where, std::move(tools), host_own);
}

std::string ToolRegistry::name_taken(const Tool& tool,
                                     const std::unordered_map<std::string_view, const Tool*>& batch) const {
  const ToolInfo& info = tool.info;
  auto described = [](const ToolInfo& other) {
    return other.aid + (other.alias_of.empty() ? " (" + other.name + ")" : " (another name of " + other.alias_of + ")");
  };
  // A front that takes a name (--http's tool_name) would find the built-in by it no more
  // (two tools of that name), or this tool in its place (an aid is looked up first).
  // (A name that is a built-in's aid leaves the built-in first: an inner host's tools, say.)
  for (const std::string* taken : {&info.aid, &info.name}) {
    if (auto it = built_in_names_.find(*taken); it != built_in_names_.end()) {
      return "tool " + info.aid + " takes the name '" + *taken + "' of the built-in tool " +
             described(it->second->info);
    }
  }
  // A call by that name would reach this tool (aids are looked up first), not the one named so.
  const Tool* named = nullptr;
  if (auto it = by_name_.find(info.aid); it != by_name_.end())
    named = it->second;
  else if (auto jt = batch.find(info.aid); jt != batch.end() && jt->second != &tool)
    named = jt->second;
  if (named != nullptr) {
    return "tool " + info.aid + " takes the name '" + info.aid + "' of the tool " + described(named->info) +
           " (an aid is looked up before a name)";
  }
  return {};
}

std::vector<std::string> ToolRegistry::add(const std::string& where, std::vector<std::unique_ptr<Tool>> tools,
                                           bool host_own) {
  auto refuse = [&](const std::string& why) { throw ConfigError(where + ": " + why); };
  std::unique_lock lock(mu_);
  std::set<std::string_view> in_plugin;
  std::unordered_map<std::string_view, const Tool*> batch;
  for (const auto& tool : tools) batch.emplace(tool->info.name, tool.get());
  for (const auto& tool : tools) {
    const std::string& aid = tool->info.aid;
    if (auto it = tools_.find(aid); it != tools_.end()) {
      refuse("duplicate aid " + aid + " (already registered by " + it->second->info.plugin_path + ")");
    }
    if (!in_plugin.insert(aid).second) refuse("duplicate aid " + aid + " (declared twice)");
    if (!host_own) {
      if (std::string why = name_taken(*tool, batch); !why.empty()) refuse(why);
    }
  }
  std::vector<std::string> added;
  for (auto& tool : tools) {
    const Tool* t = tool.get();
    by_name_.emplace(t->info.name, t);
    if (host_own) built_in_names_.emplace(t->info.name, t);
    added.push_back(t->info.aid);
    order_.push_back(t->info.aid);
    tools_.emplace(t->info.aid, std::move(tool));
  }
  std::vector<const Tool*> in_order;
  in_order.reserve(order_.size());
  for (const auto& aid : order_) in_order.push_back(tools_.find(aid)->second.get());
  names_.rebuild(in_order);
  return added;
}

const Tool* ToolRegistry::find(std::string_view aid) const {
  // Callers mostly call the same tool again and again: each thread remembers its last
  // hit, which needs no lock and no hashing. Tools are never removed while the registry
  // lives, so a remembered pointer stays good.
  struct LastHit {
    std::uint64_t serial = 0;
    std::string aid;
    const Tool* tool = nullptr;
  };
  thread_local LastHit last;
  if (last.serial == serial_ && last.aid == aid) return last.tool;
  const Tool* tool = nullptr;
  {
    std::shared_lock lock(mu_);
    auto it = tools_.find(aid);
    if (it == tools_.end()) return nullptr;
    tool = it->second.get();
  }
  last.serial = serial_;
  last.aid.assign(aid);
  last.tool = tool;
  return tool;
}

const Tool* ToolRegistry::resolve(std::string_view name, std::vector<std::string>* sharing) const {
  if (const Tool* t = find(name)) return t;
  std::shared_lock lock(mu_);
  const ToolNames::Found found = names_.find(name);
  if (sharing != nullptr) {
    sharing->clear();
    for (const Tool* t : found.sharing) sharing->push_back(t->info.aid);
  }
  return found.tool;
}

std::string ToolRegistry::llm_name(const Tool& tool) const {
  std::shared_lock lock(mu_);
  return names_.llm_name(tool);
}

std::vector<ToolInfo> ToolRegistry::list() const {
  std::shared_lock lock(mu_);
  std::vector<ToolInfo> out;
  out.reserve(order_.size());
  for (const auto& aid : order_) out.push_back(tools_.find(aid)->second->info);
  return out;
}

std::vector<const Tool*> ToolRegistry::tools() const {
  std::shared_lock lock(mu_);
  std::vector<const Tool*> out;
  out.reserve(order_.size());
  for (const auto& aid : order_) out.push_back(tools_.find(aid)->second.get());
  return out;
}

std::size_t ToolRegistry::size() const {
  std::shared_lock lock(mu_);
  return tools_.size();
}

}  // namespace machina
