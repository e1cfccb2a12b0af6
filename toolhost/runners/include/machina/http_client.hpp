// An HTTP/1.1 client for one origin, as the service runner needs it: POST with a deadline
// that covers connecting, the TLS handshake, writing and reading; keep-alive connections
// reused (and a stale one retried once on a fresh connection); the answer's body bounded.
// Boost.Beast parses and writes the messages; sockets, deadlines and the connection pool
// are ours; TLS (https) is the layer a program installs with use_tls().
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace machina::http {

/// `http://host[:port]/path` or `https://host[:port]/path` split up.
struct Url {
  std::string host;
  std::string port = "80";   // 443 for https
  std::string target = "/";  // path and query
  bool tls = false;          // https

  /// False, with `why`, for anything but an http or https URL with a host.
  static bool parse(std::string_view text, Url& out, std::string& why);
  std::string origin() const { return (tls ? "https://" : "http://") + host + ":" + port; }
};

using Headers = std::vector<std::pair<std::string, std::string>>;

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
  Headers headers;  // the answer's header fields, as sent
  std::string body;
  bool reused = false;  // answered over a kept-alive connection

  /// The value of the answer's header field `name` (compared without case); "" without one.
  std::string header(std::string_view name) const;
};

/// How a host name becomes addresses: the addresses, or none with `why`.
using Resolver = std::vector<sockaddr_storage> (*)(const std::string& host, const std::string& port, std::string& why);
/// By default numeric addresses and "localhost" only: a statically linked program cannot use
/// the C library's resolver safely. Programs linked dynamically install it (getaddrinfo).
void use_system_resolver();

/// A TLS session over a connected non-blocking socket. Reads and writes move bytes like
/// recv and send: `n` of them when `done`; otherwise the socket to wait for, the end of
/// the stream, or a failure with `why`.
class TlsSession {
 public:
  enum class Io { done, want_read, want_write, closed, failed };
  virtual ~TlsSession() = default;
  virtual Io write(const char* data, std::size_t size, std::size_t& n, std::string& why) = 0;
  virtual Io read(char* data, std::size_t size, std::size_t& n, std::string& why) = 0;
  /// Bytes received and not read yet.
  virtual bool pending() const = 0;
};

/// The TLS settings of one origin (the CAs it is verified against), loaded once.
class TlsContext {
 public:
  virtual ~TlsContext() = default;
  /// The handshake over `fd` before the deadline, verifying the peer's certificate and that
  /// it is for `url.host`; null with `failure` and `why` otherwise.
  virtual std::unique_ptr<TlsSession> handshake(int fd, const Url& url, std::int64_t deadline_ms,
                                                Reply::Failure& failure, std::string& why) = 0;
};

/// Makes the TLS context of an origin: verifying against `ca_file` (PEM), or against the
/// system's store when it is empty; null with `why` when the CAs cannot be loaded.
using TlsFactory = std::unique_ptr<TlsContext> (*)(const std::string& ca_file, std::string& why);
/// Programs that call https services install TLS (OpenSSL, http_tls.cpp); without it an
/// https origin is refused.
void use_tls();

class Client {
 public:
  /// `ca_file`: for an https origin, the CAs its certificate is verified against ("": the
  /// system's). `max_idle`: connections kept alive for later requests, at most.
  explicit Client(Url origin, std::string ca_file = {}, std::size_t max_idle = 8);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  /// Empty when the client can make requests; otherwise why not (an https origin in a
  /// program without TLS, a CA file that cannot be loaded).
  const std::string& unusable() const { return unusable_; }

  /// POSTs `body` (application/json) to `target` on this origin. Thread-safe.
  Reply post(const std::string& target, std::string_view body, const Headers& headers, std::int64_t deadline_ms,
             std::size_t max_body);
  /// A request of any method ("POST", "DELETE", …); a body only if not empty. Thread-safe.
  Reply send(std::string_view method, const std::string& target, std::string_view body, const Headers& headers,
             std::int64_t deadline_ms, std::size_t max_body);

  const Url& origin() const { return origin_; }
  /// Connections opened so far (for tests of keep-alive).
  std::uint64_t connections_opened() const;

 private:
  struct Connection {
    int fd = -1;
    std::unique_ptr<TlsSession> tls;  // https
  };
  Connection take_idle();
  void give_back(Connection c);
  static void close(Connection& c);
  Reply exchange(Connection& c, const std::string& request, std::int64_t deadline_ms, std::size_t max_body, bool& keep);

  Url origin_;
  std::size_t max_idle_;
  std::unique_ptr<TlsContext> tls_;
  std::string unusable_;
  mutable std::mutex mu_;
  std::vector<Connection> idle_;
  std::uint64_t opened_ = 0;
};

}  // namespace machina::http
