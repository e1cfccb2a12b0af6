// See http_admission.hpp.
#include "http_admission.hpp"

#include "http_field_text.hpp"

#include <machina/errors.hpp>
#include <machina/loopback_host.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cctype>
#include <utility>

namespace machina::cli {
namespace {

bool is_ipv4(const std::string& text) {
  in_addr a{};
  return ::inet_pton(AF_INET, text.c_str(), &a) == 1;
}

bool is_ipv6(const std::string& text) {
  in6_addr a{};
  return ::inet_pton(AF_INET6, text.c_str(), &a) == 1;
}

bool is_wildcard(const std::string& host) {
  return host == "0.0.0.0" || host == "::";
}

/// A Host field's value (or an allowed name) split into its name, lowercase, IPv6 literals in
/// brackets, and its port ("" when it names none). False when it is not of that form.
bool split_authority(std::string_view value, std::string& name, std::string& port) {
  value = trimmed(value);
  std::string_view rest;
  if (!value.empty() && value.front() == '[') {
    const auto close = value.find(']');
    if (close == std::string_view::npos || !is_ipv6(std::string(value.substr(1, close - 1)))) return false;
    name = lowercase(value.substr(0, close + 1));
    rest = value.substr(close + 1);
  } else {
    const auto colon = value.find(':');
    name = lowercase(value.substr(0, colon));
    rest = colon == std::string_view::npos ? std::string_view{} : value.substr(colon);
  }
  if (name.empty()) return false;
  if (name.front() != '[' && name.find_first_of(" \t/\\@?#[]") != std::string::npos) return false;
  if (rest.empty()) {
    port.clear();
    return true;
  }
  if (rest.front() != ':' || rest.size() < 2 || rest.size() > 6) return false;
  port = std::string(rest.substr(1));
  return std::all_of(port.begin(), port.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

}  // namespace

void check_admission_rules(const std::string& bound_host, const AdmissionRules& rules) {
  if (rules.token.empty() && !is_loopback_host(bound_host))
    throw ConfigError("--http " + bound_host +
                      ": not a loopback address, so every request must carry a bearer token: "
                      "set MACHINA_TOOLHOST_HTTP_TOKEN (or serve on 127.0.0.1 behind a proxy)");
  for (const auto& origin : rules.allow_origins) {
    const auto scheme_end = origin.find("://");
    const bool ok =
        origin == "null" || (scheme_end != std::string::npos && scheme_end > 0 && scheme_end + 3 < origin.size() &&
                             origin.find_first_of("/ ?#", scheme_end + 3) == std::string::npos);
    if (!ok)
      throw ConfigError("--http-allow-origin " + origin +
                        ": expected an origin as a browser sends it, "
                        "SCHEME://HOST[:PORT] without a path (e.g. http://localhost:3000)");
  }
  for (const auto& name : rules.allow_hosts) {
    std::string n, p;
    if (!split_authority(name, n, p)) throw ConfigError("--http-allow-host " + name + ": expected NAME or NAME:PORT");
  }
}

HttpAdmission::HttpAdmission(AdmissionRules rules, const std::string& bound_host, unsigned port)
    : rules_(std::move(rules)), port_(std::to_string(port)) {
  auto own = [&](const std::string& name) { own_authorities_.push_back(lowercase(name) + ":" + port_); };
  if (is_wildcard(bound_host))
    any_ip_literal_ = true;
  else
    own(is_ipv6(bound_host) ? "[" + bound_host + "]" : bound_host);
  if (is_loopback_host(bound_host) || is_wildcard(bound_host)) {
    own("localhost");
    own("127.0.0.1");
    own("[::1]");
  }
  for (const auto& name : rules_.allow_hosts) {
    std::string n, p;
    (void)split_authority(name, n, p);  // (checked at start)
    if (p.empty())
      allowed_names_.push_back(n);
    else
      own_authorities_.push_back(n + ":" + p);
  }
}

bool HttpAdmission::host_allowed(std::string_view host_field) const {
  std::string name, port;
  if (!split_authority(host_field, name, port)) return false;
  if (std::find(allowed_names_.begin(), allowed_names_.end(), name) != allowed_names_.end()) return true;
  if (port.empty()) port = "80";
  if (std::find(own_authorities_.begin(), own_authorities_.end(), name + ":" + port) != own_authorities_.end())
    return true;
  if (!any_ip_literal_ || port != port_) return false;
  return is_ipv4(name) || (name.size() > 2 && name.front() == '[' && is_ipv6(name.substr(1, name.size() - 2)));
}

bool HttpAdmission::origin_allowed(std::string_view origin) const {
  const std::string o = lowercase(trimmed(origin));
  return std::any_of(rules_.allow_origins.begin(), rules_.allow_origins.end(),
                     [&](const std::string& allowed) { return lowercase(allowed) == o; });
}

bool HttpAdmission::authorized(std::string_view authorization) const {
  if (rules_.token.empty()) return true;
  const std::string expected = "Bearer " + rules_.token;
  // Compared in time that does not depend on where they differ.
  unsigned char diff = authorization.size() == expected.size() ? 0 : 1;
  for (std::size_t i = 0; i < expected.size(); ++i)
    diff |= static_cast<unsigned char>(expected[i] ^ (i < authorization.size() ? authorization[i] : 0));
  return diff == 0;
}

}  // namespace machina::cli
