// A tiny HTTP server for unit tests: a thread on a free loopback port answering each
// complete request (headers and a Content-Length body) with one fixed reply, or with what a
// function of the request makes, keeping the connection; it counts connections and keeps
// the last request it read.
#pragma once

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace machina::test {

/// A listening socket on a free port of 127.0.0.1; `port` receives the port.
inline int loopback_listener(int& port) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
  port = ntohs(a.sin_port);
  ::listen(listener, 8);
  return listener;
}

struct TinyServer {
  int listener = -1;
  int port = 0;
  std::atomic<int> connections{0};
  std::string reply;
  std::function<std::string(const std::string& request)> respond;  // (set: answers in place of `reply`)
  std::mutex mu;
  std::string last_request;  // guarded by mu
  std::thread thread;

  explicit TinyServer(std::string r) : reply(std::move(r)) { start(); }
  explicit TinyServer(std::function<std::string(const std::string& request)> f) : respond(std::move(f)) { start(); }

  void start() {
    listener = loopback_listener(port);
    thread = std::thread([this] {
      for (;;) {
        const int fd = ::accept(listener, nullptr, nullptr);
        if (fd < 0) return;
        ++connections;
        std::string in;
        char buf[4096];
        for (;;) {
          const ssize_t n = ::read(fd, buf, sizeof buf);
          if (n <= 0) break;
          in.append(buf, static_cast<std::size_t>(n));
          // One answer per complete request (headers and a Content-Length body).
          for (;;) {
            const auto end = in.find("\r\n\r\n");
            if (end == std::string::npos) break;
            const auto cl = in.find("Content-Length: ");
            const std::size_t body = cl != std::string::npos ? std::stoul(in.substr(cl + 16)) : 0;
            if (in.size() < end + 4 + body) break;
            const std::string request = in.substr(0, end + 4 + body);
            {
              std::lock_guard lock(mu);
              last_request = request;
            }
            in.erase(0, end + 4 + body);
            const std::string answer = respond ? respond(request) : reply;
            (void)!::write(fd, answer.data(), answer.size());
          }
        }
        ::close(fd);
      }
    });
  }
  ~TinyServer() {
    ::shutdown(listener, SHUT_RDWR);
    ::close(listener);
    thread.join();
  }
};

inline std::string ok_reply(const std::string& body) {
  return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}

}  // namespace machina::test
