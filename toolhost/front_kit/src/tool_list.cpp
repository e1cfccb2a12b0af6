// See tool_list.hpp.
#include <machina/runner.hpp>
#include <machina/tool_list.hpp>
#include <machina/tool_names.hpp>

#include <nlohmann/json.hpp>

namespace machina {

std::string tool_list_json(const Host& host) {
  nlohmann::json tools = nlohmann::json::array();
  auto parsed = [](const std::string& text) { return text.empty() ? nlohmann::json() : nlohmann::json::parse(text); };
  for (const Tool* t : host.registry().tools()) {
    const ToolInfo& i = t->info;
    tools.push_back({{"aid", i.aid},
                     {"name", i.name},
                     {"description", i.description},
                     {"input_schema", parsed(declared_input_schema(i))},
                     {"deterministic", i.deterministic},
                     {"tags", i.tags},
                     {"side_effects", i.side_effects},
                     {"replay_inputs", i.replay_inputs},
                     {"tier", i.tier},
                     {"timeout_ms", host.timeout_for(*t, Request{})},
                     {"plugin", i.plugin_path},
                     {"runner", t->runner != nullptr ? std::string(t->runner->kind()) : std::string()}});
    // What a tool hosted from a skill or an MCP server says of itself besides.
    auto& entry = tools.back();
    if (!i.listed_schema.empty()) entry["input_schema_checked_by"] = "tool";
    if (!i.title.empty()) entry["title"] = i.title;
    if (!i.alias_of.empty()) entry["alias_of"] = i.alias_of;
    if (!i.output_schema.empty()) entry["output_schema"] = parsed(i.output_schema);
    // (As every front advertises them: the host's view of the tool's risk wins over its server's.)
    if (!i.annotations.empty()) entry["annotations"] = nlohmann::json(advertised_annotations(i));
  }
  return tools.dump();
}

}  // namespace machina
