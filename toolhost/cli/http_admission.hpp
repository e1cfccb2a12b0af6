// Which HTTP requests the HTTP front lets reach a tool: those naming one of its own Host names
// (a page whose own name resolves to this address is refused: DNS rebinding), from no Origin
// or an allowed one, and carrying the bearer token when one is set. Also the check of those
// settings at start (a token is required off loopback).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace machina::cli {

struct AdmissionRules {
  std::string token;                       // "": no bearer token asked for
  std::vector<std::string> allow_origins;  // Origin values served
  std::vector<std::string> allow_hosts;    // Host names served beside the bound address; "NAME:PORT" pins the port
};

/// Throws ConfigError for rules a front bound to `bound_host` must not serve with: no token
/// off loopback, an Origin not written as a browser sends it, a Host name of the wrong form.
void check_admission_rules(const std::string& bound_host, const AdmissionRules& rules);

class HttpAdmission {
 public:
  /// For a front bound to `bound_host` (numeric, "localhost" or a wildcard) on `port`, with
  /// rules check_admission_rules accepted.
  HttpAdmission(AdmissionRules rules, const std::string& bound_host, unsigned port);

  /// Whether a request's Host field names this front.
  bool host_allowed(std::string_view host_field) const;
  bool origin_allowed(std::string_view origin) const;
  /// Whether an Authorization field carries the token (compared in time that does not
  /// depend on where they differ); always true without a token.
  bool authorized(std::string_view authorization) const;

 private:
  AdmissionRules rules_;
  std::vector<std::string> own_authorities_;  // "name:port", lowercase: Host values served
  std::vector<std::string> allowed_names_;    // configured names served on any port
  bool any_ip_literal_ = false;               // bound to every address: any numeric Host
  std::string port_;
};

}  // namespace machina::cli
