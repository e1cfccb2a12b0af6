// See hosted_server.hpp: the aids a hosted server's tools are registered under, and the
// runner of one of its tools.
#include <machina/runners/hosted_server.hpp>

#include <nlohmann/json.hpp>

#include <cctype>

namespace machina {

std::string remote_aid(const std::string& prefix, const std::string& tool) {
  std::string out = prefix;
  for (char c : tool) {
    out.push_back(std::isalnum(static_cast<unsigned char>(c))
                      ? static_cast<char>(std::toupper(static_cast<unsigned char>(c)))
                      : '_');
  }
  return out + ".v1";
}

std::string default_aid_prefix(const std::string& kind, const std::string& name) {
  std::string out = kind == "mcp_server" || kind == "mcp" ? "AID.MCP." : "AID.SKILL.";
  for (char c : name) {
    out.push_back(std::isalnum(static_cast<unsigned char>(c))
                      ? static_cast<char>(std::toupper(static_cast<unsigned char>(c)))
                      : '_');
  }
  return out + ".";
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
