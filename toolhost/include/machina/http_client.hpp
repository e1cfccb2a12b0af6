// An HTTP/1.1 client for one origin, as the service runner needs it: POST with a deadline
// that covers connecting, writing and reading; keep-alive connections reused (and a stale
// one retried once on a fresh connection); the answer's body bounded. Boost.Beast parses
// and writes the messages; sockets, deadlines and the connection pool are ours.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace machina::http {

/// `http://host[:port]/path` split up. (https is refused: this build speaks plain HTTP.)
struct Url {
  std::string host;
  std::string port = "80";
  std::string target = "/";  // path and query

  /// False, with `why`, for anything but an http URL with a host.
  static bool parse(std::string_view text, Url& out, std::string& why);
  std::string origin() const { return "http://" + host + ":" + port; }
};

struct Reply {
  enum class Failure {
    none,         // an answer: `status` and `body`
    unreachable,  // no connection (refused, unknown host, reset before any answer)
    timed_out,    // the deadline passed
    too_large,    // the body passed `max_body`
    bad_reply     // not an HTTP/1.1 answer
  };
  Failure failure = Failure::none;
  std::string detail;  // what went wrong
  unsigned status = 0;
  std::string body;
  bool reused = false;  // answered over a kept-alive connection
};

using Headers = std::vector<std::pair<std::string, std::string>>;

/// How a host name becomes addresses: the addresses, or none with `why`.
using Resolver = std::vector<sockaddr_storage> (*)(const std::string& host, const std::string& port, std::string& why);
/// By default numeric addresses and "localhost" only: a statically linked program cannot use
/// the C library's resolver safely. Programs linked dynamically install it (getaddrinfo).
void use_system_resolver();

class Client {
 public:
  /// `max_idle`: connections kept alive for later requests, at most.
  explicit Client(Url origin, std::size_t max_idle = 8);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  /// POSTs `body` (application/json) to `target` on this origin. Thread-safe.
  Reply post(const std::string& target, std::string_view body, const Headers& headers, std::int64_t deadline_ms,
             std::size_t max_body);

  const Url& origin() const { return origin_; }
  /// Connections opened so far (for tests of keep-alive).
  std::uint64_t connections_opened() const;

 private:
  int take_idle();
  void give_back(int fd);
  Reply exchange(int fd, const std::string& request, std::int64_t deadline_ms, std::size_t max_body, bool& keep);

  Url origin_;
  std::size_t max_idle_;
  mutable std::mutex mu_;
  std::vector<int> idle_;
  std::uint64_t opened_ = 0;
};

}  // namespace machina::http
