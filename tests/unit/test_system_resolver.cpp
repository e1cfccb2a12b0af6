// system_resolver (the C library's resolver for the HTTP client): once installed, a name
// from the system's hosts database reaches a local server, a name that does not resolve
// fails as unreachable naming it, and numeric addresses still work.
#include <machina/clock.hpp>
#include <machina/http_client.hpp>

#include "tiny_http_server.hpp"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

using namespace machina::http;

namespace {

/// This machine's name if the system resolves it to 127.0.0.1 (its hosts file), else "".
std::string loopback_host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || std::string(name) == "localhost") return "";
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* found = nullptr;
  if (getaddrinfo(name, nullptr, &hints, &found) != 0) return "";
  const bool loopback = reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr.s_addr == htonl(INADDR_LOOPBACK);
  freeaddrinfo(found);
  return loopback ? name : "";
}

Reply post_to(const std::string& host, int port) {
  Client client(Url{host, std::to_string(port), "/"});
  return client.post("/", "{}", {}, machina::steady_now_ms() + 5000, 1 << 10);
}

}  // namespace

TEST_CASE("with the system resolver, names resolve through the C library") {
  use_system_resolver();
  machina::test::TinyServer server(machina::test::ok_reply("ok"));

  Reply r = post_to("127.0.0.1", server.port);
  REQUIRE(r.failure == Reply::Failure::none);
  CHECK(r.body == "ok");

  r = post_to("no-such-host.invalid", server.port);
  CHECK(r.failure == Reply::Failure::unreachable);
  CHECK(r.detail.find("cannot resolve no-such-host.invalid: ") != std::string::npos);
  CHECK(r.detail.find("only numeric addresses") == std::string::npos);

  const std::string name = loopback_host_name();
  if (name.empty()) {
    MESSAGE("this machine's name does not resolve to 127.0.0.1: the hosts-file case is skipped");
    return;
  }
  r = post_to(name, server.port);
  REQUIRE_MESSAGE(r.failure == Reply::Failure::none, r.detail);
  CHECK(r.status == 200);
  CHECK(r.body == "ok");
}
