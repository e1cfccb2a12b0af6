// See http_client.hpp.
#include <machina/clock.hpp>
#include <machina/http_client.hpp>

#include <boost/beast/core/string.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>

#ifndef MACHINA_VERSION
#define MACHINA_VERSION "dev"
#endif

namespace machina::http {
namespace beast_http = boost::beast::http;
namespace {

/// Numeric IPv4 and IPv6 addresses, and localhost.
std::vector<sockaddr_storage> resolve_numeric(const std::string& host, const std::string& port, std::string& why) {
  std::vector<sockaddr_storage> out;
  const auto number = static_cast<std::uint16_t>(std::stoi(port));
  auto v4 = [&](const char* text) {
    sockaddr_storage ss{};
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    a->sin_family = AF_INET;
    a->sin_port = htons(number);
    if (::inet_pton(AF_INET, text, &a->sin_addr) == 1) out.push_back(ss);
  };
  auto v6 = [&](const char* text) {
    sockaddr_storage ss{};
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(number);
    if (::inet_pton(AF_INET6, text, &a->sin6_addr) == 1) out.push_back(ss);
  };
  if (host == "localhost") {
    v4("127.0.0.1");
    v6("::1");
  } else {
    v4(host.c_str());
    v6(host.c_str());
  }
  if (out.empty()) why = "cannot resolve " + host + ": this program resolves only numeric addresses and localhost";
  return out;
}

Resolver g_resolver = &resolve_numeric;
TlsFactory g_tls = nullptr;

int millis_left(std::int64_t deadline_ms) {
  return static_cast<int>(std::clamp<std::int64_t>(deadline_ms - steady_now_ms(), 0, 1 << 30));
}

/// A connected, non-blocking TCP socket; -1 with `failure` and `why` otherwise.
int connect_to(const Url& url, std::int64_t deadline_ms, Reply::Failure& failure, std::string& why) {
  const std::vector<sockaddr_storage> found = g_resolver(url.host, url.port, why);
  if (found.empty()) {
    failure = Reply::Failure::unreachable;
    return -1;
  }
  int fd = -1;
  for (auto it = found.begin(); it != found.end() && fd < 0; ++it) {
    const auto* addr = reinterpret_cast<const sockaddr*>(&*it);
    const socklen_t addr_len = addr->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
    fd = ::socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      why = std::string("cannot make a socket: ") + std::strerror(errno);
      continue;
    }
    if (::connect(fd, addr, addr_len) != 0 && errno != EINPROGRESS) {
      why = std::string("cannot connect to ") + url.origin() + ": " + std::strerror(errno);
      ::close(fd);
      fd = -1;
      continue;
    }
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, millis_left(deadline_ms)) == 0) {
      ::close(fd);
      failure = Reply::Failure::timed_out;
      why = "no connection to " + url.origin() + " before the deadline";
      return -1;
    }
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      why = std::string("cannot connect to ") + url.origin() + ": " + std::strerror(err);
      ::close(fd);
      fd = -1;
    }
  }
  if (fd < 0) {
    failure = Reply::Failure::unreachable;
    return -1;
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

}  // namespace

void set_resolver(Resolver r) {
  g_resolver = r;
}
void set_tls(TlsFactory f) {
  g_tls = f;
}

bool Url::parse(std::string_view text, Url& out, std::string& why) {
  out = Url{};
  if (text.substr(0, 8) == "https://") {
    out.tls = true;
    out.port = "443";
    text.remove_prefix(8);
  } else if (text.substr(0, 7) == "http://") {
    text.remove_prefix(7);
  } else {
    why = "the URL must start with http:// or https://";
    return false;
  }
  const auto slash = text.find_first_of("/?");
  std::string_view authority = text.substr(0, slash);
  out.target = slash == std::string_view::npos ? "/" : std::string(text.substr(slash));
  if (out.target.front() == '?') out.target.insert(0, "/");
  if (authority.find('@') != std::string_view::npos) {
    why = "the URL must not carry credentials (use token_env)";
    return false;
  }
  if (!authority.empty() && authority.front() == '[') {  // [v6 address]:port
    const auto close = authority.find(']');
    if (close == std::string_view::npos) {
      why = "the URL's IPv6 address is not closed";
      return false;
    }
    out.host = std::string(authority.substr(1, close - 1));
    authority.remove_prefix(close + 1);
    if (!authority.empty() && authority.front() == ':') out.port = std::string(authority.substr(1));
  } else {
    const auto colon = authority.rfind(':');
    out.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) out.port = std::string(authority.substr(colon + 1));
  }
  if (out.host.empty()) {
    why = "the URL has no host";
    return false;
  }
  if (out.port.empty() || out.port.size() > 5 || !std::all_of(out.port.begin(), out.port.end(), ::isdigit) ||
      std::stoi(out.port) < 1 || std::stoi(out.port) > 65535) {
    why = "the URL's port must be 1..65535";
    return false;
  }
  return true;
}

Client::Client(Url origin, std::string ca_file, std::size_t max_idle)
    : origin_(std::move(origin)), max_idle_(max_idle) {
  if (!origin_.tls) return;
  if (g_tls == nullptr) {
    unusable_ = "this program does not speak https";
    return;
  }
  tls_ = g_tls(ca_file, unusable_);
}

Client::~Client() {
  for (auto& c : idle_) close(c);
}

void Client::close(Connection& c) {
  c.tls.reset();  // (its end is sent while the socket is open)
  if (c.fd >= 0) ::close(c.fd);
  c.fd = -1;
}

std::uint64_t Client::connections_opened() const {
  std::lock_guard lock(mu_);
  return opened_;
}

Client::Connection Client::take_idle() {
  std::lock_guard lock(mu_);
  while (!idle_.empty()) {
    Connection c = std::move(idle_.back());
    idle_.pop_back();
    // Closed by the server meanwhile (or holding bytes nobody asked for): not usable.
    char byte;
    const ssize_t n = ::recv(c.fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && !(c.tls && c.tls->pending())) return c;
    close(c);
  }
  return {};
}

void Client::give_back(Connection c) {
  std::lock_guard lock(mu_);
  if (idle_.size() < max_idle_) {
    idle_.push_back(std::move(c));
  } else {
    close(c);
  }
}

namespace {

/// What a TLS read or write came to, as recv and send say it: > 0 bytes, 0 for the end of
/// the stream, -1 with `wait` (POLLIN, POLLOUT) to wait for, or -1 with `wait` 0 for a failure.
ssize_t tls_outcome(TlsSession::Io io, std::size_t n, short& wait) {
  switch (io) {
    case TlsSession::Io::done: return static_cast<ssize_t>(n);
    case TlsSession::Io::want_read: wait = POLLIN; return -1;
    case TlsSession::Io::want_write: wait = POLLOUT; return -1;
    case TlsSession::Io::closed: return 0;
    case TlsSession::Io::failed: break;
  }
  return -1;
}

/// A part of `data` sent over the connection, TLS or not (as tls_outcome says), `why` for a failure.
ssize_t send_some(int fd, TlsSession* tls, const char* data, std::size_t size, short& wait, std::string& why) {
  wait = 0;
  std::size_t n = 0;
  if (tls != nullptr) {
    const TlsSession::Io io = tls->write(data, size, n, why);
    return tls_outcome(io, n, wait);
  }
  for (;;) {
    const ssize_t sent = ::send(fd, data, size, MSG_NOSIGNAL);
    if (sent >= 0) return sent;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
      wait = POLLOUT;
    else
      why = std::strerror(errno);
    return -1;
  }
}

/// What has arrived over the connection, TLS or not, into `data` (as tls_outcome says).
ssize_t recv_some(int fd, TlsSession* tls, char* data, std::size_t size, short& wait, std::string& why) {
  wait = 0;
  std::size_t n = 0;
  if (tls != nullptr) {
    const TlsSession::Io io = tls->read(data, size, n, why);
    return tls_outcome(io, n, wait);
  }
  for (;;) {
    const ssize_t got = ::recv(fd, data, size, 0);
    if (got >= 0) return got;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
      wait = POLLIN;
    else
      why = std::strerror(errno);
    return -1;
  }
}

}  // namespace

Reply Client::exchange(Connection& c, const std::string& request, std::int64_t deadline_ms, std::size_t max_body,
                       bool& keep) {
  Reply r;
  keep = false;
  std::size_t sent = 0;
  std::string why;
  short wait = 0;
  while (sent < request.size()) {
    const ssize_t n = send_some(c.fd, c.tls.get(), request.data() + sent, request.size() - sent, wait, why);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
      continue;
    }
    if (wait == 0) {
      r.failure = Reply::Failure::unreachable;
      r.detail = "the connection to " + origin_.origin() + " failed: " + (n == 0 ? "closed" : why);
      return r;
    }
    pollfd p{c.fd, wait, 0};
    if (::poll(&p, 1, millis_left(deadline_ms)) == 0) {
      r.failure = Reply::Failure::timed_out;
      r.detail = "the request to " + origin_.origin() + " could not be sent before the deadline";
      return r;
    }
  }
  beast_http::response_parser<beast_http::string_body> parser;
  parser.body_limit(max_body);
  // Not eager: Boost 1.74's eager parse of a header and its body in one buffer skips the
  // Content-Length check against the body limit, so the header is put on its own first.
  parser.eager(false);
  std::string pending;
  char chunk[64 * 1024];
  bool got_any = false;
  while (!parser.is_done()) {
    const ssize_t n = recv_some(c.fd, c.tls.get(), chunk, sizeof chunk, wait, why);
    boost::beast::error_code ec;
    if (n > 0) {
      got_any = true;
      pending.append(chunk, static_cast<std::size_t>(n));
      while (!pending.empty() && !parser.is_done()) {
        const std::size_t used = parser.put(boost::asio::buffer(pending.data(), pending.size()), ec);
        pending.erase(0, used);
        if (ec == beast_http::error::need_more) break;
        if (!ec && parser.is_header_done() && parser.content_length() && *parser.content_length() > max_body) {
          ec = beast_http::error::body_limit;  // (checked here too, whatever the parser's version does)
        }
        if (ec == beast_http::error::body_limit) {
          r.failure = Reply::Failure::too_large;
          r.detail = "the answer from " + origin_.origin() + " is larger than " + std::to_string(max_body) + " bytes";
          return r;
        }
        if (ec) {
          r.failure = Reply::Failure::bad_reply;
          r.detail = "the answer from " + origin_.origin() + " is not HTTP/1.1: " + ec.message();
          return r;
        }
        if (used == 0) break;
      }
      continue;
    }
    if (n == 0) {  // closed: the end of a body without a length, or an answer cut short
      if (got_any && parser.is_header_done()) {
        parser.put_eof(ec);
        if (!ec) break;
      }
      r.failure = got_any ? Reply::Failure::bad_reply : Reply::Failure::unreachable;
      r.detail = got_any ? "the answer from " + origin_.origin() + " was cut short"
                         : "the connection to " + origin_.origin() + " was closed before any answer";
      return r;
    }
    if (wait == 0) {
      r.failure = got_any ? Reply::Failure::bad_reply : Reply::Failure::unreachable;
      r.detail = "the connection to " + origin_.origin() + " failed: " + why;
      return r;
    }
    pollfd p{c.fd, wait, 0};
    if (::poll(&p, 1, millis_left(deadline_ms)) == 0) {
      r.failure = Reply::Failure::timed_out;
      r.detail = "no answer from " + origin_.origin() + " before the deadline";
      return r;
    }
  }
  auto& message = parser.get();
  r.status = message.result_int();
  for (const auto& field : message)
    r.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  r.body = std::move(message.body());
  keep = message.keep_alive() && pending.empty();
  return r;
}

std::string Reply::header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (boost::beast::iequals(key, boost::beast::string_view(name.data(), name.size()))) return value;
  }
  return {};
}

Reply Client::post(const std::string& target, std::string_view body, const Headers& headers, std::int64_t deadline_ms,
                   std::size_t max_body) {
  return send("POST", target, body, headers, deadline_ms, max_body);
}

Reply Client::send(std::string_view method, const std::string& target, std::string_view body, const Headers& headers,
                   std::int64_t deadline_ms, std::size_t max_body) {
  beast_http::request<beast_http::string_body> req{
      beast_http::string_to_verb(boost::beast::string_view(method.data(), method.size())), target, 11};
  const bool default_port = origin_.port == (origin_.tls ? "443" : "80");
  const std::string host = origin_.host.find(':') != std::string::npos ? "[" + origin_.host + "]" : origin_.host;
  req.set(beast_http::field::host, default_port ? host : host + ":" + origin_.port);
  req.set(beast_http::field::user_agent, "machina-toolhost/" MACHINA_VERSION);
  if (!body.empty()) req.set(beast_http::field::content_type, "application/json");
  req.set(beast_http::field::accept, "application/json");
  req.keep_alive(true);
  for (const auto& [name, value] : headers) req.set(name, value);
  req.body().assign(body);
  req.prepare_payload();
  std::ostringstream text;
  text << req;
  const std::string request = text.str();

  if (!unusable_.empty()) {
    Reply r;
    r.failure = Reply::Failure::unreachable;
    r.detail = origin_.origin() + ": " + unusable_;
    return r;
  }
  for (int attempt = 0;; ++attempt) {
    Connection c = attempt == 0 ? take_idle() : Connection{};
    const bool reused = c.fd >= 0;
    if (!reused) {
      Reply r;
      c.fd = connect_to(origin_, deadline_ms, r.failure, r.detail);
      if (c.fd < 0) return r;
      {
        std::lock_guard lock(mu_);
        ++opened_;
      }
      if (tls_) {
        c.tls = tls_->handshake(c.fd, origin_, deadline_ms, r.failure, r.detail);
        if (!c.tls) {
          close(c);
          return r;
        }
      }
    }
    bool keep = false;
    Reply r = exchange(c, request, deadline_ms, max_body, keep);
    r.reused = reused;
    if (keep && r.failure == Reply::Failure::none) {
      give_back(std::move(c));
    } else {
      close(c);
    }
    // A kept-alive connection the server had closed: once more on a fresh one.
    if (reused && r.failure == Reply::Failure::unreachable && attempt == 0) continue;
    return r;
  }
}

}  // namespace machina::http
