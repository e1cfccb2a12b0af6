// The one rule for the tools a front gets when it is told nothing else: no plugin named
// means the built-in tools plus every tool pack.
#include <machina/tool_host.hpp>

#include <cstdlib>

namespace machina {

bool loads_plugin_libraries(const ToolChoice& choice) {
  return choice.plugins && !choice.plugins->empty();
}

Policy pack_policy(const std::string& policy_file) {
  if (policy_file.empty()) return policy_from_env();
  const char* workspace = std::getenv("MACHINA_TOOLHOST_WORKSPACE");
  return load_policy(policy_file, workspace != nullptr ? workspace : "");
}

std::vector<std::string> ToolHost::load_default_tools(const ToolChoice& choice) {
  std::vector<std::string> added;
  const auto take = [&added](std::vector<std::string> aids) {
    added.insert(added.end(), std::make_move_iterator(aids.begin()), std::make_move_iterator(aids.end()));
  };
  const bool packs = choice.packs ? !choice.packs->empty() : !choice.plugins;
  if (packs)
    take(add_packs(choice.packs ? *choice.packs : std::vector<std::string>{}, pack_policy(choice.policy_file)));
  if (choice.plugins) {
    for (const auto& path : *choice.plugins) {
      if (choice.load_library == nullptr) throw ConfigError("this program cannot load plugin libraries: " + path);
      take((this->*choice.load_library)(path));
    }
  } else if (choice.linked_builtin) {
    take(add_linked_plugin(*choice.linked_builtin));
  } else {
    if (choice.load_library == nullptr) throw ConfigError("this program cannot load the built-in plugin library");
    take((this->*choice.load_library)(choice.builtin_plugin));
  }
  for (const auto& manifest : choice.manifests) take(load_tools(manifest));
  return added;
}

}  // namespace machina
