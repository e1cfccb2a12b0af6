// Which requests the HTTP front admits: its own Host names by how it is bound (loopback, one
// address, every address), configured names with or without a pinned port, Origins compared
// without case, the bearer token, and the settings refused at start.
#include "../../toolhost/cli/http_admission.hpp"

#include <machina/errors.hpp>

#include <doctest/doctest.h>

using namespace machina;
using cli::AdmissionRules;
using cli::HttpAdmission;

TEST_CASE("a front on loopback answers to its loopback names on its own port only") {
  const HttpAdmission a({}, "127.0.0.1", 8080);
  CHECK(a.host_allowed("127.0.0.1:8080"));
  CHECK(a.host_allowed("LOCALHOST:8080"));
  CHECK(a.host_allowed("[::1]:8080"));
  CHECK(a.host_allowed(" localhost:8080 "));
  CHECK_FALSE(a.host_allowed("localhost:8081"));
  CHECK_FALSE(a.host_allowed("localhost"));  // (port 80)
  CHECK_FALSE(a.host_allowed("attacker.example:8080"));
  CHECK_FALSE(a.host_allowed("10.0.0.1:8080"));
  CHECK_FALSE(a.host_allowed("127.0.0.1@evil:8080"));
  CHECK_FALSE(a.host_allowed(""));
}

TEST_CASE("a front on every address answers to any numeric Host on its port, and to configured names") {
  AdmissionRules rules;
  rules.token = "t";
  rules.allow_hosts = {"tools.internal", "Proxy.Example:443"};
  const HttpAdmission a(rules, "0.0.0.0", 9000);
  CHECK(a.host_allowed("10.1.2.3:9000"));
  CHECK(a.host_allowed("[fe80::1]:9000"));
  CHECK_FALSE(a.host_allowed("10.1.2.3:9001"));
  CHECK(a.host_allowed("tools.internal"));
  CHECK(a.host_allowed("tools.internal:1234"));  // no port pinned: any
  CHECK(a.host_allowed("proxy.example:443"));
  CHECK_FALSE(a.host_allowed("proxy.example:9000"));  // pinned to 443
  CHECK_FALSE(a.host_allowed("other.internal:9000"));
}

TEST_CASE("origins are compared without case, and the token exactly") {
  AdmissionRules rules;
  rules.token = "s3cret";
  rules.allow_origins = {"http://localhost:3000"};
  const HttpAdmission a(rules, "127.0.0.1", 8080);
  CHECK(a.origin_allowed("HTTP://LOCALHOST:3000"));
  CHECK_FALSE(a.origin_allowed("http://localhost:3001"));
  CHECK_FALSE(a.origin_allowed("null"));
  CHECK(a.authorized("Bearer s3cret"));
  CHECK_FALSE(a.authorized("Bearer s3cre"));
  CHECK_FALSE(a.authorized("Bearer s3cretX"));
  CHECK_FALSE(a.authorized("bearer s3cret"));
  CHECK_FALSE(a.authorized(""));
  CHECK(HttpAdmission({}, "127.0.0.1", 8080).authorized(""));  // no token set: none asked for
}

TEST_CASE("rules refused at start: no token off loopback, a malformed Origin or Host name") {
  AdmissionRules none;
  CHECK_NOTHROW(cli::check_admission_rules("127.0.0.1", none));
  CHECK_NOTHROW(cli::check_admission_rules("::1", none));
  CHECK_THROWS_AS(cli::check_admission_rules("0.0.0.0", none), ConfigError);
  CHECK_THROWS_AS(cli::check_admission_rules("192.168.1.5", none), ConfigError);
  AdmissionRules origin;
  origin.allow_origins = {"http://localhost:3000/app"};
  CHECK_THROWS_AS(cli::check_admission_rules("127.0.0.1", origin), ConfigError);
  origin.allow_origins = {"localhost:3000"};
  CHECK_THROWS_AS(cli::check_admission_rules("127.0.0.1", origin), ConfigError);
  origin.allow_origins = {"null", "https://app.example"};
  CHECK_NOTHROW(cli::check_admission_rules("127.0.0.1", origin));
  AdmissionRules host;
  host.allow_hosts = {"name:notaport"};
  CHECK_THROWS_AS(cli::check_admission_rules("127.0.0.1", host), ConfigError);
  host.allow_hosts = {"a/b"};
  CHECK_THROWS_AS(cli::check_admission_rules("127.0.0.1", host), ConfigError);
}
