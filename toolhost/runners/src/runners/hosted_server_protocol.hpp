// What the files of a hosted server (hosted_server_*.cpp, skill_services.cpp) share: the
// MCP revision it asks for first and the envelope of its requests, a session's params, and
// a call in flight on the child.
#pragma once

#include <machina/runners/hosted_server.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <mutex>
#include <string>

#ifndef MACHINA_VERSION
#define MACHINA_VERSION "dev"
#endif

namespace machina {

// MCP 2026-07-28: asked first, with server/discover (as the official SDK's client does in its
// auto mode, with its probe's time limit; here also at most half the time left to start, so
// that a server which leaves the probe unanswered still has time for the handshake); a
// server that does not list it among its versions is spoken to with the initialize handshake.
inline constexpr const char* kModernVersion = "2026-07-28";
inline constexpr std::int64_t kDiscoverTimeoutMs = 10'000;
inline constexpr int kUnsupportedProtocolVersion = -32022;
// The per-request envelope of 2026-07-28: this client's version, name and capabilities (none).
inline const std::string kEnvelope =
    std::string(R"("io.modelcontextprotocol/protocolVersion":")") + kModernVersion +
    R"(","io.modelcontextprotocol/clientInfo":{"name":"machina-toolhost","version":")" + MACHINA_VERSION +
    R"("},"io.modelcontextprotocol/clientCapabilities":{})";

/// Whether a list of protocol versions (a DiscoverResult's supportedVersions, a -32022
/// error's supported) holds 2026-07-28.
inline bool lists_modern(const nlohmann::json& versions) {
  if (!versions.is_array()) return false;
  return std::any_of(versions.begin(), versions.end(), [](const nlohmann::json& v) { return v == kModernVersion; });
}

/// The params of a skill's session notice (lifecycle/onSessionStart, skill/sessionStart ...).
inline std::string session_params(const std::string& id) {
  return nlohmann::json{{"sessionId", id}}.dump();
}

/// A call in flight on the child: what its state/* requests and progress reach.
struct HostedServer::InFlight {
  CallContext* call = nullptr;
  ProgressSink* progress = nullptr;
  std::mutex mu;  // the call's context, between the thread reading the child and the caller
};

}  // namespace machina
