// The HTTP client of the service runner (http_client.hpp): URLs, keep-alive, deadlines and
// the body bound, against a server thread written here on raw sockets.
#include <machina/clock.hpp>
#include <machina/http_client.hpp>

#include <doctest/doctest.h>

#include "tiny_http_server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>

using namespace machina::http;
using machina::test::ok_reply;
using machina::test::TinyServer;

TEST_CASE("URLs: http or https with a host, an optional port and a target") {
  Url u;
  std::string why;
  REQUIRE(Url::parse("http://127.0.0.1:8080/run?x=1", u, why));
  CHECK((u.host == "127.0.0.1" && u.port == "8080" && u.target == "/run?x=1"));
  REQUIRE(Url::parse("http://example.com", u, why));
  CHECK((u.host == "example.com" && u.port == "80" && u.target == "/"));
  REQUIRE(Url::parse("http://[::1]:9/a", u, why));
  CHECK((u.host == "::1" && u.port == "9" && u.target == "/a"));
  REQUIRE(Url::parse("https://example.com/", u, why));
  CHECK((u.tls && u.host == "example.com" && u.port == "443" && u.origin() == "https://example.com:443"));
  for (const char* bad :
       {"ftp://x/", "http:///run", "http://h:0/", "http://h:99999/", "http://user:pw@h/", "http://h:x/"}) {
    CAPTURE(bad);
    CHECK_FALSE(Url::parse(bad, u, why));
  }
}

TEST_CASE("requests reuse one kept-alive connection") {
  TinyServer server(ok_reply(R"({"ok":true,"result":1})"));
  Client client(Url{"127.0.0.1", std::to_string(server.port), "/"});
  for (int i = 0; i < 5; ++i) {
    const Reply r = client.post("/run", "{}", {}, machina::steady_now_ms() + 5000, 1 << 20);
    REQUIRE(r.failure == Reply::Failure::none);
    CHECK(r.status == 200);
    CHECK(r.body == R"({"ok":true,"result":1})");
  }
  CHECK(client.connections_opened() == 1);
  CHECK(server.connections == 1);
}

TEST_CASE("a body past the bound, a refused connection and a silent server each fail their own way") {
  TinyServer big(ok_reply(std::string(5000, 'x')));
  Client to_big(Url{"127.0.0.1", std::to_string(big.port), "/"});
  CHECK(to_big.post("/", "{}", {}, machina::steady_now_ms() + 5000, 1000).failure == Reply::Failure::too_large);

  TinyServer silent("");  // reads, never answers
  Client to_silent(Url{"127.0.0.1", std::to_string(silent.port), "/"});
  const auto started = machina::steady_now_ms();
  const Reply late = to_silent.post("/", "{}", {}, started + 200, 1000);
  CHECK(late.failure == Reply::Failure::timed_out);
  CHECK(machina::steady_now_ms() - started < 2000);

  TinyServer junk("SPEAKING NOT HTTP\r\n\r\n");
  Client to_junk(Url{"127.0.0.1", std::to_string(junk.port), "/"});
  CHECK(to_junk.post("/", "{}", {}, machina::steady_now_ms() + 5000, 1000).failure == Reply::Failure::bad_reply);

  Client nowhere(Url{"127.0.0.1", "9", "/"});
  const Reply refused = nowhere.post("/", "{}", {}, machina::steady_now_ms() + 5000, 1000);
  CHECK(refused.failure == Reply::Failure::unreachable);
  CHECK(refused.detail.find("Connection refused") != std::string::npos);

  Client unnamed(Url{"no-such-host.invalid", "80", "/"});
  CHECK(unnamed.post("/", "{}", {}, machina::steady_now_ms() + 5000, 1000).failure == Reply::Failure::unreachable);
}
