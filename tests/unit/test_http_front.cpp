// The HTTP front in-process, over real sockets: a call answered {ok, result}, a name two tools
// share refused, the handshake, the tool list, a missing bearer token, a foreign Host or
// Origin, an allowed Origin's CORS answer, a body that is not JSON by its type, a body over
// the cap, ambiguous framing, a connection beyond the per-peer cap refused, and the front
// returning 0 once told to stop, a kept-alive connection closed.
#include "../../toolhost/cli/http_front.hpp"
#include "front_runner.hpp"

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

using namespace machina;
using nlohmann::json;

namespace {

constexpr char kToken[] = "unit-token";

/// The front on a free loopback port with a token and a 1 KiB body cap; `adjust` changes
/// the options first.
test::FrontRunner http_front(const std::function<void(cli::HttpFrontOptions&)>& adjust = {}) {
  cli::HttpFrontOptions options;
  options.port = "0";
  options.token = kToken;
  options.max_body_bytes = 1024;
  if (adjust) adjust(options);
  return test::FrontRunner(
      [options](Host& host, const cli::FrontControl& control) { return cli::serve_http(host, options, control); });
}

int port_of(const std::string& url) {
  return std::stoi(url.substr(url.rfind(':') + 1));
}

/// A connection to 127.0.0.1:`port`, closed when it goes.
struct Connection {
  int fd = -1;
  explicit Connection(int port) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  }
  ~Connection() { ::close(fd); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  void send(const std::string& text) const {
    std::size_t at = 0;
    while (at < text.size()) {
      const ssize_t n = ::send(fd, text.data() + at, text.size() - at, MSG_NOSIGNAL);
      REQUIRE(n > 0);
      at += static_cast<std::size_t>(n);
    }
  }
  /// Reads for at most 10 s: one response (its headers and Content-Length body), or "" when
  /// the connection closes first.
  std::string response() const {
    std::string got;
    char chunk[4096];
    for (;;) {
      const std::size_t head_end = got.find("\r\n\r\n");
      if (head_end != std::string::npos) {
        std::size_t length = 0;
        if (const std::size_t at = got.find("Content-Length: "); at != std::string::npos && at < head_end)
          length = std::stoul(got.substr(at + 16));
        if (got.size() >= head_end + 4 + length) return got.substr(0, head_end + 4 + length);
      }
      pollfd p{fd, POLLIN, 0};
      REQUIRE(::poll(&p, 1, 10'000) == 1);
      const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
      if (n <= 0) return got.empty() ? std::string() : got;
      got.append(chunk, static_cast<std::size_t>(n));
    }
  }
};

struct Answer {
  int status = 0;
  std::string head;
  json body;
};

Answer answer_of(const std::string& text) {
  Answer a;
  REQUIRE(text.starts_with("HTTP/1.1 "));
  a.status = std::stoi(text.substr(9, 3));
  const std::size_t head_end = text.find("\r\n\r\n");
  a.head = text.substr(0, head_end);
  const std::string body = text.substr(head_end + 4);
  a.body = body.empty() ? json() : json::parse(body);
  return a;
}

/// A request's text: `method` `target` with the front's own Host, the token, a JSON type and
/// `body` by its Content-Length, closing the connection; `headers` ("Name: value\r\n" each)
/// added or, if they name Host, Authorization or Content-Type, used instead.
std::string request(int port, const std::string& method, const std::string& target, const std::string& body,
                    const std::string& headers = "") {
  std::string text = method + " " + target + " HTTP/1.1\r\n";
  if (headers.find("Host:") == std::string::npos) text += "Host: 127.0.0.1:" + std::to_string(port) + "\r\n";
  if (headers.find("Authorization:") == std::string::npos)
    text += std::string("Authorization: Bearer ") + kToken + "\r\n";
  if (headers.find("Content-Type:") == std::string::npos && !body.empty()) text += "Content-Type: application/json\r\n";
  text += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  return text + headers + "Connection: close\r\n\r\n" + body;
}

Answer round_trip(int port, const std::string& text) {
  Connection c(port);
  c.send(text);
  return answer_of(c.response());
}

Answer post(int port, const std::string& target, const json& body, const std::string& headers = "") {
  return round_trip(port, request(port, "POST", target, body.dump(), headers));
}

}  // namespace

TEST_CASE("the HTTP front runs a call by aid, refuses a shared name, and lists and describes its tools") {
  test::FrontRunner front = http_front();
  const int port = port_of(front.address());
  CHECK(front.address() == "http://127.0.0.1:" + std::to_string(port));

  const Answer called = post(port, "/", {{"tool_name", "AID.UNIT.ECHO.v1"}, {"payload", {{"n", 1}}}});
  CHECK(called.status == 200);
  CHECK(called.body.at("ok") == true);
  CHECK(called.body.at("result") == json{{"n", 1}});

  const Answer by_path = post(port, "/tools/AID.UNIT.OTHER.v1", {{"payload", {{"n", 2}}}});
  CHECK(by_path.body.at("result") == json{{"n", 2}});

  const Answer shared = post(port, "/", {{"tool_name", "echo"}, {"payload", json::object()}});
  CHECK(shared.status == 404);
  CHECK(shared.body.at("error").at("type") == "tool_not_found");
  CHECK(shared.body.at("error").at("message").get<std::string>().find("AID.UNIT.ECHO.v1, AID.UNIT.OTHER.v1") !=
        std::string::npos);

  const Answer unknown = post(port, "/", {{"tool_name", "AID.UNIT.NONE.v1"}});
  CHECK(unknown.status == 200);
  CHECK(unknown.body.at("ok") == false);
  CHECK(unknown.body.at("code") == "tool_not_found");

  const Answer handshake = post(port, "/capabilities/handshake",
                                {{"tool_name", "AID.UNIT.ECHO.v1"}, {"required_guarantees", {{"no_such_wall", true}}}});
  CHECK(handshake.status == 200);
  CHECK(handshake.body.at("tool_name") == "AID.UNIT.ECHO.v1");
  CHECK(handshake.body.at("enforcement") == "not_enforceable");

  const Answer version = post(port, "/", {{"tool_name", "AID.UNIT.ECHO.v1"}, {"protocol_version", 2}});
  CHECK(version.status == 400);
  CHECK(version.body.at("error").at("type") == "malformed_request");

  const Answer tools = round_trip(port, request(port, "GET", "/tools", ""));
  CHECK(tools.status == 200);
  REQUIRE(tools.body.at("tools").is_array());
  CHECK(tools.body.at("tools").size() == 2);
  CHECK(round_trip(port, request(port, "GET", "/health", "")).body == json{{"ok", true}});
  CHECK(round_trip(port, request(port, "GET", "/nothing", "")).status == 404);
  CHECK(front.stop() == 0);
}

TEST_CASE("the HTTP front refuses a request without the token, from a foreign Host or Origin, or not JSON") {
  test::FrontRunner front = http_front([](cli::HttpFrontOptions& o) { o.allow_origins = {"http://localhost:3000"}; });
  const int port = port_of(front.address());
  const json call = {{"tool_name", "AID.UNIT.ECHO.v1"}, {"payload", json::object()}};

  const Answer no_token = post(port, "/", call, "Authorization: Bearer wrong\r\n");
  CHECK(no_token.status == 401);
  CHECK(no_token.body.at("error").at("type") == "unauthorized");

  const Answer foreign_host = post(port, "/", call, "Host: tools.example:" + std::to_string(port) + "\r\n");
  CHECK(foreign_host.status == 403);
  CHECK(foreign_host.body.at("error").at("type") == "host_not_allowed");

  const Answer foreign_origin = post(port, "/", call, "Origin: http://pages.example\r\n");
  CHECK(foreign_origin.status == 403);
  CHECK(foreign_origin.body.at("error").at("type") == "origin_not_allowed");

  const Answer allowed_origin = post(port, "/", call, "Origin: http://localhost:3000\r\n");
  CHECK(allowed_origin.status == 200);
  CHECK(allowed_origin.head.find("Access-Control-Allow-Origin: http://localhost:3000") != std::string::npos);

  const Answer plain_text = post(port, "/", call, "Content-Type: text/plain\r\n");
  CHECK(plain_text.status == 415);
  CHECK(plain_text.body.at("error").at("type") == "unsupported_media_type");

  const Answer not_json = round_trip(port, request(port, "POST", "/", "{\"tool_name\":"));
  CHECK(not_json.status == 400);
  CHECK(not_json.body.at("error").at("type") == "malformed_request");
  CHECK(front.stop() == 0);
}

TEST_CASE("the HTTP front refuses a body over its cap and framing a proxy could read otherwise") {
  test::FrontRunner front = http_front();
  const int port = port_of(front.address());

  const Answer big = post(port, "/", {{"tool_name", "AID.UNIT.ECHO.v1"}, {"payload", std::string(2000, 'x')}});
  CHECK(big.status == 413);
  CHECK(big.body.at("error").at("type") == "request_too_large");

  const Answer both = round_trip(port, request(port, "POST", "/", "{}", "Transfer-Encoding: chunked\r\n"));
  CHECK(both.status == 400);
  CHECK(both.body.at("error").at("type") == "malformed_request");

  const Answer old = round_trip(port, "POST / HTTP/1.0\r\nHost: 127.0.0.1:" + std::to_string(port) +
                                          "\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n");
  CHECK(old.status == 400);
  CHECK(old.body.at("error").at("message") == "Transfer-Encoding in an HTTP/1.0 request");

  const std::string chunked_body = "{\"tool_name\":\"AID.UNIT.ECHO.v1\",\"payload\":7}";
  std::string chunked = "POST / HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) + "\r\nAuthorization: Bearer " +
                        kToken +
                        "\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
  char size[16];
  std::snprintf(size, sizeof size, "%zx\r\n", chunked_body.size());
  chunked += size + chunked_body + "\r\n0\r\n\r\n";
  const Answer alone = round_trip(port, chunked);
  CHECK(alone.status == 200);
  CHECK(alone.body.at("result") == 7);

  const Answer gzip = round_trip(port, "POST / HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) +
                                           "\r\nTransfer-Encoding: gzip, chunked\r\n\r\n");
  CHECK(gzip.status == 400);
  CHECK(
      gzip.body.at("error").at("message").get<std::string>().starts_with("the only transfer coding served is chunked"));
  CHECK(front.stop() == 0);
}

TEST_CASE("the HTTP front refuses a connection beyond the per-peer cap and closes kept-alive ones on stop") {
  test::FrontRunner front = http_front([](cli::HttpFrontOptions& o) { o.max_connections_per_peer = 1; });
  const int port = port_of(front.address());

  // A kept-alive connection, answered once: it holds the peer's one slot.
  Connection kept(port);
  std::string text = request(port, "GET", "/health", "");
  text.replace(text.find("Connection: close"), 17, "Connection: keep-alive");
  kept.send(text);
  CHECK(answer_of(kept.response()).status == 200);

  Connection second(port);
  const Answer refused = answer_of(second.response());
  CHECK(refused.status == 503);
  CHECK(refused.body.at("error").at("type") == "overloaded");
  CHECK(refused.body.at("error").at("message").get<std::string>().find("too many connections from 127.0.0.1") !=
        std::string::npos);

  CHECK(front.stop() == 0);
  CHECK(kept.response().empty());  // closed by the stop, with no answer
}
