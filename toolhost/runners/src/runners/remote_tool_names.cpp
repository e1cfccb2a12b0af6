// See hosted_server.hpp: the aids a hosted server's tools are registered under, and the
// runner of one of its tools.
#include <machina/aid_word.hpp>
#include <machina/runners/hosted_server.hpp>

#include <nlohmann/json.hpp>

namespace machina {

std::string remote_aid(const std::string& prefix, const std::string& tool) {
  return prefix + aid_word(tool) + ".v1";
}

std::string default_aid_prefix(const std::string& kind, const std::string& name) {
  return (kind == "mcp_server" ? "AID.MCP." : "AID.SKILL.") + aid_word(name) + ".";
}

HostedServerToolRunner::HostedServerToolRunner(std::shared_ptr<HostedServer> server, std::string tool,
                                               std::string enforcement_json)
    : server_(std::move(server)), tool_(std::move(tool)) {
  const auto how = nlohmann::json::parse(enforcement_json.empty() ? "{}" : enforcement_json, nullptr, false);
  if (how.is_object()) {
    for (const auto& [name, _] : how.items()) {
      if (name != "sandbox") enforced_.push_back(name);
    }
  }
}

}  // namespace machina
