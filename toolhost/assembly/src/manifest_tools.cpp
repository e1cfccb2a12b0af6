// ToolHost::load_tools: the tools of a tool manifest, each registered with the runner its kind
// needs. Python tools share a pool of warm workers per interpreter and set-up (import root,
// environment, sandbox, limits).
#include <machina/errors.hpp>
#include <machina/executable_file.hpp>
#include <machina/http_client.hpp>
#include <machina/loopback_host.hpp>
#include <machina/python_entry_check.hpp>
#include <machina/python_sandbox.hpp>
#include <machina/runners/container_runner.hpp>
#include <machina/runners/hosted_server.hpp>
#include <machina/runners/python_interpreter.hpp>
#include <machina/runners/remote_mcp_server.hpp>
#include <machina/runners/service_runner.hpp>
#include <machina/runners/skill_environment.hpp>
#include <machina/schema_validator.hpp>
#include <machina/state_home.hpp>
#include <machina/tool_host.hpp>
#include <machina/tool_manifest.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <map>

namespace machina {
namespace {

/// Why a bearer token is not sent to a server reached over plain HTTP off this machine.
constexpr const char* kTokenOverPlainHttp = "a bearer token is sent only over https:// (or to this machine)";

/// The error of a tool's field, as the manifest loader words its own.
[[noreturn]] void refuse_field(const ToolManifest& m, const ManifestTool& t, std::size_t index,
                               const std::string& field, const std::string& why) {
  if (!t.pack.source.empty()) {  // a pack's tool: its binding in tools.yaml
    throw ConfigError(t.pack.bindings_path + ":" + std::to_string(t.line) + ": tool '" + t.info.name + "': field '" +
                      field + "': " + why);
  }
  throw ConfigError(m.path + ":" + std::to_string(t.line) + ": tool " + std::to_string(index) + " (" + t.info.aid +
                    "): field '" + field + "': " + why);
}

std::string capability_context(const ManifestTool& t, const std::string& runner) {
  nlohmann::ordered_json guarantees = nlohmann::ordered_json::object();
  for (const auto& [name, required] : t.guarantees) guarantees[name] = required;
  nlohmann::ordered_json c = {
      {"tool_name", t.info.name}, {"resolved_source", t.pack.source.empty() ? "binding" : t.pack.source},
      {"runner", runner},         {"protocol_version", 1},
      {"guarantees", guarantees}, {"sources", nlohmann::ordered_json::object()}};
  for (const auto& [name, required] : t.guarantees) c["sources"][name] = "tool";
  if (!t.write_root.empty()) c["filesystem_root"] = t.write_root;
  if (!t.read_roots.empty()) c["filesystem_read_roots"] = t.read_roots;
  return c.dump();
}

/// Where a tool of a manifest or a pack comes from, for its calls' traces.
ToolSource source_of(const ManifestTool& t) {
  ToolSource s;
  if (!t.pack.source.empty()) {
    s.resolved_source = t.pack.source;
    s.pack_id = t.pack.id;
    s.pack_name = t.pack.name;
    s.pack_version = t.pack.version;
  }
  s.deps_source = t.deps_source;
  return s;
}

/// The error of a skill's or an MCP server's entry.
[[noreturn]] void refuse_child(const ToolManifest& m, const ManifestChild& c, const std::string& why) {
  throw ConfigError(m.path + ":" + std::to_string(c.line) + ": " + c.kind + " " + c.name + ": " + why);
}

/// What to tell the operator of the variables a skill directory's manifest.json asks for
/// that the tool manifest's `env` does not list ("" for none): they are not passed.
std::string asked_env_warning(const ManifestChild& c) {
  std::string names;
  for (const auto& name : c.skill_env) {
    if (std::find(c.env.begin(), c.env.end(), name) != c.env.end()) continue;
    const bool plain = !name.empty() && std::all_of(name.begin(), name.end(), [](char ch) {
      return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_';
    });
    names += (names.empty() ? "" : ", ") +
             (plain ? name : nlohmann::json(name).dump(-1, ' ', true, nlohmann::json::error_handler_t::replace));
  }
  if (names.empty()) return {};
  return c.kind + " " + c.name + ": its manifest.json asks for the environment variables " + names +
         "; only the tool manifest's env passes variables to a skill: not passed";
}

/// Whether `value` can go into a header field as it is: no control characters.
bool header_value(std::string_view value) {
  return std::none_of(value.begin(), value.end(), [](unsigned char c) { return c < 0x20 || c == 0x7f; });
}

/// The tool a skill or an MCP server offers, as the registry knows it.
ToolInfo remote_info(const ToolManifest& m, const ManifestChild& c, const RemoteTool& r) {
  ToolInfo info = c.defaults;
  info.aid = remote_aid(c.aid_prefix.empty() ? default_aid_prefix(c.kind, c.name) : c.aid_prefix, r.name);
  info.name = r.name;
  info.description = r.description;
  info.title = r.title;
  info.output_schema = r.output_schema;
  info.annotations = r.annotations;
  info.plugin_path = m.path;
  if (!r.input_schema.empty()) {
    try {
      SchemaValidator check(r.input_schema);
      info.input_schema = r.input_schema;
    } catch (const ConfigError&) {
      info.listed_schema = r.input_schema;  // the tool checks its input itself
    }
  }
  return info;
}

}  // namespace

std::string ToolHost::skill_python(const ToolManifest& manifest, const ManifestChild& c,
                                   const std::string& program) const {
  if (std::filesystem::path(program).filename().string().rfind("python", 0) != 0) {
    refuse_child(manifest, c,
                 std::string("its ") + kSkillRequirementsFile + " needs a Python skill; its command runs " + program);
  }
  if (host_.options().workers.executable.empty()) {
    refuse_child(manifest, c,
                 std::string("its ") + kSkillRequirementsFile +
                     " is installed within walls the machina-toolhost executable puts up, and none is known");
  }
  SkillEnvironmentSpec spec;
  spec.name = c.name;
  spec.skill_dir = c.dir;
  spec.base_python = program;
  spec.sandbox_executable = host_.options().workers.executable;
  spec.root = toolhost_state_dir() + "/skill-envs";
  try {
    const SkillEnvironment env = prepare_skill_environment(spec);
    host_.event("skill " + c.name + ": " + (env.made ? "made" : "reused") + " the environment of its " +
                kSkillRequirementsFile + ", " + env.python);
    return env.python;
  } catch (const ConfigError& e) {
    refuse_child(manifest, c, e.what());
  }
}

void ToolHost::add_remote_server(const ToolManifest& manifest, const ManifestChild& c,
                                 std::vector<ToolRegistry::Described>& described,
                                 std::vector<std::unique_ptr<Runner>>& runners) {
  RemoteMcpOptions o;
  o.name = c.name;
  o.url = c.url;
  o.ca_file = c.ca_file;
  o.headers = c.headers;
  o.start_timeout_ms = c.start_timeout_ms;
  o.max_answer_bytes = host_.options().max_output_bytes + (1u << 20);
  if (!c.token_env.empty()) {
    const char* token = std::getenv(c.token_env.c_str());
    if (token == nullptr || *token == '\0')
      refuse_child(manifest, c, "token_env: the variable " + c.token_env + " is not set");
    if (!header_value(token))
      refuse_child(manifest, c, "token_env: the variable " + c.token_env + " holds control characters");
    http::Url url;
    std::string why;
    const bool loopback = http::Url::parse(c.url, url, why) && is_loopback_host(url.host);
    if (!url.tls && !loopback) refuse_child(manifest, c, std::string("token_env: ") + kTokenOverPlainHttp);
    o.headers.emplace_back("Authorization", std::string("Bearer ") + token);
  }
  std::shared_ptr<RemoteMcpServer> server;
  std::vector<RemoteTool> tools;
  try {
    server = std::make_shared<RemoteMcpServer>(std::move(o));
    tools = server->start();
  } catch (const ConfigError& e) {
    refuse_child(manifest, c, e.what());
  }
  if (tools.empty()) refuse_child(manifest, c, "it offers no tools");
  for (const RemoteTool& r : tools) {
    runners.push_back(std::make_unique<RemoteMcpToolRunner>(server, r.name));
    described.push_back({remote_info(manifest, c, r), runners.back().get()});
  }
}

std::vector<std::shared_ptr<HostedServer>> ToolHost::start_children(const ToolManifest& manifest,
                                                                    std::vector<ToolRegistry::Described>& described,
                                                                    std::vector<std::unique_ptr<Runner>>& runners) {
  const HostOptions& options = host_.options();
  std::vector<std::shared_ptr<HostedServer>> started;
  try {
    for (const ManifestChild& c : manifest.children) {
      if (!c.url.empty()) {
        add_remote_server(manifest, c, described, runners);
        continue;
      }
      std::string program;
      try {
        program = resolve_interpreter(c.command.front(), c.dir);
      } catch (const ConfigError& e) {
        refuse_child(manifest, c, std::string("its command: ") + e.what());
      }
      if (c.skill_requirements) program = skill_python(manifest, c, program);
      SandboxPlan plan;
      try {
        plan = plan_child_sandbox(c, program, options.workers.executable, options.workers.limits);
      } catch (const ConfigError& e) {
        refuse_child(manifest, c, std::string("cannot be confined as asked: ") + e.what());
      }
      HostedServerOptions o;
      using Dialect = HostedServerOptions::Dialect;
      o.dialect = c.kind == "mcp_server" ? Dialect::mcp
                  : c.methods == "skill" ? Dialect::runtime_skill
                                         : Dialect::lifecycle_skill;
      o.name = c.name;
      o.child.argv = plan.launcher;
      o.child.argv.push_back(program);
      o.child.argv.insert(o.child.argv.end(), c.command.begin() + 1, c.command.end());
      if (const std::string warning = asked_env_warning(c); !warning.empty()) host_.event(warning);
      std::vector<std::string> pass(std::begin(kWorkerEnvironment), std::end(kWorkerEnvironment));
      pass.insert(pass.end(), options.workers.pass_env.begin(), options.workers.pass_env.end());
      pass.insert(pass.end(), c.env.begin(), c.env.end());
      o.child.env = plan.empty_environment ? std::vector<std::string>{} : pick_environment(pass);
      o.child.cwd = c.dir;
      o.child.name = (c.kind == "mcp_server" ? "MCP server " : "skill ") + c.name;
      o.child.on_event = options.on_event;
      o.child.max_line_bytes = options.max_output_bytes + (1u << 20);
      o.start_timeout_ms = c.start_timeout_ms;
      o.tick_interval_ms = c.tick_interval_ms >= 0                         ? c.tick_interval_ms
                           : c.kind == "skill" && c.methods == "lifecycle" ? options.skill_tick_ms
                                                                           : 0;
      o.data_dir = c.data_dir;
      o.skill_manifest_json = c.skill_manifest_json;
      o.on_event = options.on_event;
      std::shared_ptr<HostedServer> toolset;
      std::vector<RemoteTool> tools;
      try {
        toolset = std::make_shared<HostedServer>(std::move(o));
        started.push_back(toolset);
        tools = toolset->start();
      } catch (const ConfigError& e) {
        refuse_child(manifest, c, e.what());
      }
      if (tools.empty()) refuse_child(manifest, c, "it offers no tools");
      for (const RemoteTool& r : tools) {
        runners.push_back(std::make_unique<HostedServerToolRunner>(toolset, r.name, plan.enforcement_json));
        described.push_back({remote_info(manifest, c, r), runners.back().get()});
      }
    }
  } catch (...) {
    for (auto& t : started) t->close();
    throw;
  }
  return started;
}

std::vector<std::string> ToolHost::load_tools(const std::string& manifest_path) {
  const HostOptions& options = host_.options();
  const ToolManifest manifest = load_tool_manifest(manifest_path);
  std::lock_guard lock(manifest_mu_);
  std::vector<std::unique_ptr<Runner>> runners;
  std::map<std::string, std::shared_ptr<PythonWorkerPool>> new_pools;
  std::vector<ToolRegistry::Described> described;
  // Python tools' entries, by interpreter and import root, checked before anything starts.
  std::map<std::pair<std::string, std::string>, std::vector<std::pair<std::size_t, const ManifestTool*>>> entries;
  std::size_t index = 0;
  for (const ManifestTool& t : manifest.tools) {
    ++index;
    if (t.runner == "python") {
      std::string python;
      try {
        python = resolve_interpreter(t.python, t.root);
      } catch (const ConfigError& e) {
        refuse_field(manifest, t, index, "python", e.what());
      }
      const std::uint64_t memory_mb = t.memory_mb != 0 ? t.memory_mb : options.python_memory_mb;
      SandboxPlan plan;
      try {
        plan = plan_python_sandbox(t, python, options.workers.executable, memory_mb);
      } catch (const ConfigError& e) {
        refuse_field(manifest, t, index, "python", e.what());
      }
      entries[{python, t.root}].emplace_back(index, &t);
      PythonPoolOptions po;
      po.python = plan.interpreter.empty() ? python : plan.interpreter;
      po.roots = {t.root};
      std::vector<std::string> pass(std::begin(kWorkerEnvironment), std::end(kWorkerEnvironment));
      pass.insert(pass.end(), options.workers.pass_env.begin(), options.workers.pass_env.end());
      pass.insert(pass.end(), t.env.begin(), t.env.end());
      po.env = plan.empty_environment ? std::vector<std::string>{} : pick_environment(pass);
      po.launcher = plan.launcher;
      po.workers = t.workers != 0 ? t.workers : std::max<std::size_t>(1, options.python_workers);
      po.memory_mb = memory_mb;
      // The output cap, and room for the trace (what the tool printed: 64 KiB a stream).
      po.max_answer_bytes = options.max_output_bytes + (1u << 20);
      po.on_event = options.on_event;
      // Tools that would start their workers alike share them.
      std::string key = po.python + '\n' + t.root + '\n' + plan.key + '\n' + std::to_string(po.workers) + '\n' +
                        std::to_string(po.memory_mb);
      for (const auto& e : po.env) key += '\n' + e;
      std::shared_ptr<PythonWorkerPool> pool;
      if (auto it = python_pools_.find(key); it != python_pools_.end())
        pool = it->second;
      else if (auto jt = new_pools.find(key); jt != new_pools.end())
        pool = jt->second;
      else
        pool = new_pools.emplace(key, std::make_shared<PythonWorkerPool>(po)).first->second;
      PythonRunner::ToolFields fields;
      fields.name = t.info.name;
      fields.entry = t.entry;
      fields.sandbox = t.sandbox;
      fields.capability_context_json = capability_context(t, "local");
      fields.enforcement_json = plan.enforcement_json;
      fields.refusal = plan.refusal;
      fields.source = source_of(t);
      runners.push_back(std::make_unique<PythonRunner>(pool, std::move(fields)));
    } else if (t.runner == "service") {
      http::Url url;
      std::string why;
      if (!http::Url::parse(t.url, url, why)) refuse_field(manifest, t, index, "url", why);
      if (!t.env.empty()) {  // a pack's secrets: no variable of this host reaches a service
        refuse_field(manifest, t, index, "secrets",
                     "capabilities.yaml gives it secrets, which reach local and container tools only; a service "
                     "reads its own");
      }
      ServiceToolFields fields;
      fields.url = t.url;
      fields.name = t.info.name;
      fields.entry = t.entry;
      fields.guarantees = t.guarantees;
      fields.unsafe_override = t.unsafe_override;
      if (!t.token_env.empty()) {
        if (!url.tls && !is_loopback_host(url.host)) refuse_field(manifest, t, index, "token_env", kTokenOverPlainHttp);
        const char* token = std::getenv(t.token_env.c_str());
        if (token == nullptr || *token == '\0') {
          refuse_field(manifest, t, index, "token_env", "the variable " + t.token_env + " is not set");
        }
        if (!header_value(token))
          refuse_field(manifest, t, index, "token_env", "the variable " + t.token_env + " holds control characters");
        fields.token = token;
      }
      fields.source = source_of(t);
      fields.app_root = t.root.empty() ? std::filesystem::path(manifest.path).parent_path().string() : t.root;
      fields.max_answer_bytes = options.max_output_bytes + (1u << 20);
      // Tools of one origin verified alike share its kept-alive connections.
      std::shared_ptr<http::Client>& client = http_clients_[url.origin() + '\n' + t.ca_file];
      if (!client) {
        auto made = std::make_shared<http::Client>(url, t.ca_file);
        if (!made->unusable().empty()) {
          refuse_field(manifest, t, index, t.ca_file.empty() ? "url" : "ca_file", made->unusable());
        }
        client = std::move(made);
      }
      runners.push_back(std::make_unique<ServiceRunner>(client, std::move(fields)));
    } else if (t.runner == "container") {
      if (const std::string why = container_image_problem(t.image); !why.empty())
        refuse_field(manifest, t, index, "image", why);
      for (const auto& name : t.env) {  // a pack's secrets: the host's variables it gets
        if (const std::string why = container_variable_problem(name); !why.empty())
          refuse_field(manifest, t, index, "secrets", why);
      }
      ContainerToolFields fields;
      // The tool's runtime, else the host's, else docker, then podman (as namel3ss picks).
      const std::string& wanted = !t.container_runtime.empty() ? t.container_runtime : options.container_runtime;
      for (const char* name : {"docker", "podman"}) {
        if (!wanted.empty() && name != wanted) continue;
        fields.runtime = find_on_path(name);
        if (fields.runtime.empty()) continue;
        fields.runtime_name = name;
        break;
      }
      if (fields.runtime.empty()) {
        refuse_field(
            manifest, t, index, t.pack.source.empty() ? "container_runtime" : "runner",
            wanted.empty() ? "neither docker nor podman is on PATH: install one of them" : wanted + " is not on PATH");
      }
      fields.image = t.image;
      fields.command = t.command.empty() ? default_container_command() : t.command;
      fields.name = t.info.name;
      fields.entry = t.entry;
      fields.env = t.container_env;
      fields.pass_env = t.env;
      fields.guarantees = t.guarantees;
      fields.memory_mb = t.memory_mb != 0 ? t.memory_mb : options.python_memory_mb;
      fields.max_answer_bytes = options.max_output_bytes + (1u << 20);
      fields.source = source_of(t);
      runners.push_back(std::make_unique<ContainerRunner>(std::move(fields)));
    } else {
      refuse_field(manifest, t, index, "runner", "'" + t.runner + "' tools are not supported by this build yet");
    }
    described.push_back({t.info, runners.back().get()});
  }
  for (const auto& [where, tools] : entries) {
    std::vector<std::string> names;
    for (const auto& [i, t] : tools) names.push_back(t->entry);
    const auto bad = find_bad_python_entries(where.first, where.second, names);
    for (const auto& [i, t] : tools) {
      if (auto it = bad.find(t->entry); it != bad.end()) refuse_field(manifest, *t, i, "entry", it->second);
    }
  }
  // Skills and MCP servers are started now: their tools are what they say they have.
  const auto toolsets = start_children(manifest, described, runners);
  std::vector<std::string> added;
  try {
    added = host_.registry_to_fill().add_described(manifest.path, std::move(described), "tool manifest");
  } catch (...) {
    for (auto& t : toolsets) t->close();
    throw;
  }
  for (auto& r : runners) manifest_runners_.push_back(std::move(r));
  for (auto& [key, pool] : new_pools) python_pools_.emplace(key, std::move(pool));
  toolsets_.insert(toolsets_.end(), toolsets.begin(), toolsets.end());
  return added;
}

}  // namespace machina
