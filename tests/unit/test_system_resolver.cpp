// system_resolver (the C library's resolver for the HTTP client): once installed, a name
// from the system's hosts database reaches a local server, a name that does not resolve
// fails as unreachable naming it, and numeric addresses still work.
#include <machina/clock.hpp>
#include <machina/http_client.hpp>

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>

using namespace machina::http;

namespace {

/// A server on 127.0.0.1 that answers each connection's first request with 200 "ok".
struct OneReplyServer {
  int listener = -1;
  int port = 0;
  std::thread thread;
  OneReplyServer() {
    listener = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    socklen_t len = sizeof a;
    ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
    ::listen(listener, 8);
    thread = std::thread([this] {
      for (int fd; (fd = ::accept(listener, nullptr, nullptr)) >= 0; ::close(fd)) {
        std::string in;
        char buf[4096];
        while (in.find("\r\n\r\n") == std::string::npos) {
          const ssize_t n = ::read(fd, buf, sizeof buf);
          if (n <= 0) break;
          in.append(buf, static_cast<std::size_t>(n));
        }
        const std::string reply = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";
        (void)!::write(fd, reply.data(), reply.size());
      }
    });
  }
  ~OneReplyServer() {
    ::shutdown(listener, SHUT_RDWR);
    ::close(listener);
    thread.join();
  }
};

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
  OneReplyServer server;

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
