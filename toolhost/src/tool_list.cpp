// See tool_list.hpp.
#include <machina/runner.hpp>
#include <machina/tool_list.hpp>

#include <nlohmann/json.hpp>

namespace machina {

std::string tool_list_json(const Host& host) {
  nlohmann::json tools = nlohmann::json::array();
  for (const Tool* t : host.registry().tools()) {
    const ToolInfo& i = t->info;
    tools.push_back({{"aid", i.aid},
                     {"name", i.name},
                     {"description", i.description},
                     {"input_schema", i.input_schema.empty() ? nlohmann::json() : nlohmann::json::parse(i.input_schema)},
                     {"deterministic", i.deterministic},
                     {"tags", i.tags},
                     {"side_effects", i.side_effects},
                     {"replay_inputs", i.replay_inputs},
                     {"tier", i.tier},
                     {"timeout_ms", host.timeout_for(*t, Request{})},
                     {"plugin", i.plugin_path},
                     {"runner", t->runner != nullptr ? std::string(t->runner->kind()) : std::string()}});
  }
  return tools.dump();
}

}  // namespace machina
