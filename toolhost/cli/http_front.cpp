// See http_front.hpp.
#include "http_front.hpp"

#include "codecs/mcp_skill_codec.hpp"
#include "http_admission.hpp"
#include "http_field_text.hpp"
#include "http_mcp.hpp"
#include "http_tool_protocol.hpp"
#include "say.hpp"
#include "stop_signal.hpp"

#include <machina/json_text.hpp>
#include <machina/sha256_hex.hpp>
#include <machina/tool_list.hpp>

#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <unordered_map>

#ifndef MACHINA_VERSION
#define MACHINA_VERSION "dev"
#endif

namespace machina::cli {
namespace {

namespace beast_http = boost::beast::http;
using Clock = std::chrono::steady_clock;

constexpr FrontLabel kHttpFront{"http", /*local_caller=*/false};  // (a network peer)

AdmissionRules admission_rules(const HttpFrontOptions& o) {
  return {o.token, o.allow_origins, o.allow_hosts};
}

/// What an answer to an allowed cross-origin request carries for the browser.
struct Cors {
  std::string_view origin;       // "": not a cross-origin request (no CORS fields)
  bool preflight = false;        // an OPTIONS preflight: which methods and fields may follow
  bool private_network = false;  // the preflight asked for a private-network address
};

/// One HTTP response, serialized.
std::string http_response(unsigned status, std::string body, bool keep_alive, const Cors& cors = {},
                          const std::vector<std::pair<std::string, std::string>>& headers = {}) {
  beast_http::response<beast_http::string_body> res{static_cast<beast_http::status>(status), 11};
  res.set(beast_http::field::server, "machina-toolhost/" MACHINA_VERSION);
  if (!body.empty()) res.set(beast_http::field::content_type, "application/json");
  if (!cors.origin.empty()) {
    res.set(beast_http::field::access_control_allow_origin,
            boost::beast::string_view(cors.origin.data(), cors.origin.size()));
    res.set(beast_http::field::vary, "Origin");
    res.set(beast_http::field::access_control_expose_headers, "Mcp-Session-Id");
    if (cors.preflight) {
      res.set(beast_http::field::access_control_allow_headers,
              "Authorization, Content-Type, Mcp-Session-Id, MCP-Protocol-Version");
      res.set(beast_http::field::access_control_allow_methods, "GET, POST, DELETE");
      res.set(beast_http::field::access_control_max_age, "600");
      if (cors.private_network) res.set("Access-Control-Allow-Private-Network", "true");
    }
  }
  for (const auto& [name, value] : headers) res.set(name, value);
  res.keep_alive(keep_alive);
  res.body() = std::move(body);
  res.prepare_payload();
  std::ostringstream text;
  text << res;
  return text.str();
}

bool write_all_fd(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, 30'000) <= 0) return false;
      continue;
    }
    return false;
  }
  return true;
}

/// Whether a Content-Type names JSON (`application/json`, parameters aside).
bool is_json_media_type(std::string_view value) {
  return lowercase(trimmed(value.substr(0, value.find(';')))) == "application/json";
}

/// Why a request's framing is refused ("": it is not). Only `Transfer-Encoding: chunked`
/// alone, or a Content-Length alone, frames a request the same way for this parser and for
/// any proxy in front of it.
template <class Header>
std::string framing_fault(const Header& h) {
  const auto te = h.count(beast_http::field::transfer_encoding);
  if (te == 0) return {};
  if (h.count(beast_http::field::content_length) != 0)
    return "a request may not carry both Transfer-Encoding and Content-Length";
  if (h.version() < 11) return "Transfer-Encoding in an HTTP/1.0 request";
  if (te != 1 || lowercase(trimmed(as_view(h[beast_http::field::transfer_encoding]))) != "chunked")
    return "the only transfer coding served is chunked, alone (Transfer-Encoding: " +
           excerpt(std::string(h[beast_http::field::transfer_encoding])) + ")";
  return {};
}

/// A client's address as text, IPv4 ones mapped into IPv6 as IPv4.
std::string peer_text(const sockaddr_storage& peer) {
  char text[INET6_ADDRSTRLEN] = "";
  if (peer.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&peer)->sin_addr, text, sizeof text);
  } else if (peer.ss_family == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(&peer)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&a))
      ::inet_ntop(AF_INET, &a.s6_addr[12], text, sizeof text);
    else
      ::inet_ntop(AF_INET6, &a, text, sizeof text);
  }
  return text;
}

class HttpServer {
 public:
  HttpServer(Host& host, const HttpFrontOptions& o, const FrontControl& control)
      : host_(host),
        o_(o),
        control_(control),
        token_caller_(token_identity(o.token)),
        mcp_(host, o.mcp_page_size, o.max_mcp_sessions) {}

  int run();

 private:
  struct Connection;
  using HttpRequest = beast_http::request<beast_http::string_body>;
  void handle(int fd, const std::string& peer);
  /// What answers one request: HTTP status, body and header fields. `conn` for the overrun sink
  /// of a stuck call.
  HttpReply dispatch(const HttpRequest& req, Connection& conn);
  HttpReply run_call(const std::string& target, const std::string& body, Connection& conn);
  /// /mcp: MCP over Streamable HTTP.
  HttpReply serve_mcp(const HttpRequest& req, Connection& conn);

  /// Who a caller with the bearer token is, for the audit store: "token:" and the first
  /// 12 hex digits of the token's SHA-256 (the token itself is never kept); "" without one.
  static std::string token_identity(const std::string& token);

  Host& host_;
  const HttpFrontOptions& o_;
  const FrontControl& control_;
  int stop_fd_ = -1;  // readable: every loop stops
  const std::string token_caller_;
  std::optional<HttpAdmission> admission_;  // once the port is known
  McpOverHttp mcp_;                         // /mcp
  std::mutex mu_;
  std::condition_variable done_;
  std::size_t active_ = 0;
  std::unordered_map<std::string, std::size_t> per_peer_;  // open connections by client address
};

/// One client connection; also the overrun sink that answers a call whose inline tool overran
/// its deadline (the thread stays in the tool; the connection is closed after the answer).
struct HttpServer::Connection final : OverrunSink {
  int fd = -1;
  std::string caller;  // who calls, for the audit store: the token's identity, else "peer:ADDRESS"
  std::mutex write_mu;
  bool answered_by_takeover = false;

  void deliver(Response response) override { deliver_body(protocol_answer(response)); }
  /// Answers the request with `body` (none: 202) and closes the connection.
  void deliver_body(std::string body) {
    std::lock_guard lock(write_mu);
    answered_by_takeover = true;
    const unsigned status = body.empty() ? 202 : 200;
    (void)write_all_fd(fd, http_response(status, std::move(body), /*keep_alive=*/false));
    ::shutdown(fd, SHUT_RDWR);
  }
};

HttpReply HttpServer::run_call(const std::string& target, const std::string& body, Connection& conn) {
  Request req;
  req.front = kHttpFront;
  req.caller = conn.caller;
  if (auto refused = read_call(host_.registry(), target, body, req)) return *refused;
  CallerState session(/*respond_with_delta=*/true);  // calls over HTTP carry no state
  const Response r = host_.handle(req, session, &conn);
  if (r.overran) return {0, {}};  // answered by the overrun sink
  return {200, protocol_answer(r)};
}

HttpReply HttpServer::dispatch(const HttpRequest& req, Connection& conn) {
  // A page in a browser can make a request reach this host (a form or a fetch without a
  // preflight, or its own name resolved to this address): a foreign Host or Origin, or a body
  // a page may send without asking first, reaches no tool.
  if (req.count(beast_http::field::host) != 1)
    return {400, refusal("malformed_request", "a request names its host in one Host field")};
  if (!admission_->host_allowed(as_view(req[beast_http::field::host])))
    return {403, refusal("host_not_allowed", "this host does not serve the name " +
                                                 excerpt(std::string(req[beast_http::field::host])) +
                                                 " (--http-allow-host)")};
  const auto origins = req.count(beast_http::field::origin);
  if (origins > 1 || (origins == 1 && !admission_->origin_allowed(as_view(req[beast_http::field::origin]))))
    return {403, refusal("origin_not_allowed", "requests from the origin " +
                                                   excerpt(std::string(req[beast_http::field::origin])) +
                                                   " are not served (--http-allow-origin)")};
  if (req.method() == beast_http::verb::options && origins == 1) return {204, {}};  // an allowed preflight
  if (!admission_->authorized(as_view(req[beast_http::field::authorization])))
    return {401, refusal("unauthorized", "a valid bearer token is required")};
  const std::string target(req.target());
  if (target == "/mcp") return serve_mcp(req, conn);
  if (req.method() == beast_http::verb::get) {
    if (target == "/health") return {200, "{\"ok\":true}"};
    if (target == "/tools") return {200, "{\"ok\":true,\"tools\":" + tool_list_json(host_) + "}"};
    return {404, refusal("not_found", "no such resource: " + excerpt(target))};
  }
  if (req.method() != beast_http::verb::post) return {405, refusal("method_not_allowed", "use POST")};
  if (req.count(beast_http::field::content_type) != 1 ||
      !is_json_media_type(as_view(req[beast_http::field::content_type])))
    return {415, refusal("unsupported_media_type", "the request body must be sent as Content-Type: application/json")};
  if (target == "/capabilities/handshake") return handshake_answer(host_.registry(), req.body());
  return run_call(target, req.body(), conn);
}

HttpReply HttpServer::serve_mcp(const HttpRequest& req, Connection& conn) {
  const std::string_view session = as_view(req[kMcpSessionHeader]);
  if (req.method() == beast_http::verb::delete_) return mcp_.end(session, conn.caller);
  if (req.method() != beast_http::verb::post)  // (no stream of the server's own messages: GET is not served)
    return {405,
            refusal("method_not_allowed", "MCP at /mcp: POST a message, or DELETE the session"),
            {{"Allow", "POST, DELETE"}}};
  if (req.count(beast_http::field::content_type) != 1 ||
      !is_json_media_type(as_view(req[beast_http::field::content_type])))
    return {415, refusal("unsupported_media_type", "the request body must be sent as Content-Type: application/json")};
  if (const std::string_view version = as_view(req["MCP-Protocol-Version"]);
      !version.empty() && !McpSkillCodec::serves_version(version))
    return {400, refusal("malformed_request", "MCP-Protocol-Version " + excerpt(std::string(version)) +
                                                  " is not a revision this server speaks")};
  return mcp_.post(session, req.body(), conn.caller, [&conn](std::string body) { conn.deliver_body(std::move(body)); });
}

std::string HttpServer::token_identity(const std::string& token) {
  if (token.empty()) return {};
  return "token:" + sha256_hex({token}, 6);
}

void HttpServer::handle(int fd, const std::string& peer) {
  Connection conn;
  conn.fd = fd;
  conn.caller = token_caller_.empty() ? "peer:" + peer : token_caller_;
  char chunk[64 * 1024];
  std::string pending;
  // A new connection's first request is timed from the accept: a connection that sends
  // nothing holds its slot no longer than one that sends its headers slowly.
  auto began = Clock::now();
  for (;;) {
    beast_http::request_parser<beast_http::string_body> parser;
    parser.eager(false);  // put() stops after the header: its framing is checked before the body
    parser.body_limit(o_.max_body_bytes);
    parser.header_limit(64 * 1024);
    unsigned refuse_status = 0;
    std::string refuse_body;
    bool framing_checked = false;
    bool closed = false;
    while (!parser.is_done() && refuse_status == 0) {
      boost::beast::error_code ec;
      while (!pending.empty() && !parser.is_done()) {
        const std::size_t used = parser.put(boost::asio::buffer(pending.data(), pending.size()), ec);
        pending.erase(0, used);
        if (ec == beast_http::error::need_more) {
          ec = {};
          break;
        }
        if (ec == beast_http::error::body_limit) {
          refuse_status = 413;
          refuse_body = refusal("request_too_large",
                                "the request body exceeds the " + std::to_string(o_.max_body_bytes) + "-byte cap");
          break;
        }
        if (ec) {
          refuse_status = 400;
          refuse_body = refusal("malformed_request", "not an HTTP/1.1 request: " + ec.message());
          break;
        }
        if (!framing_checked && parser.is_header_done()) {
          framing_checked = true;
          if (std::string fault = framing_fault(parser.get()); !fault.empty()) {
            refuse_status = 400;
            refuse_body = refusal("malformed_request", fault);
            break;
          }
        }
        if (used == 0) break;
      }
      if (parser.is_done() || refuse_status != 0) break;
      const bool begun = began != Clock::time_point{};
      int left = o_.idle_timeout_ms;
      if (begun) {
        const auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - began).count();
        left = static_cast<int>((parser.is_header_done() ? o_.read_timeout_ms : o_.header_timeout_ms) - spent);
      }
      pollfd p[2] = {{fd, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
      const int ready = left <= 0 ? 0 : ::poll(p, 2, left);
      if (ready == 0 && begun && !parser.is_header_done()) {
        std::lock_guard lock(conn.write_mu);
        (void)write_all_fd(fd,
                           http_response(408,
                                         refusal("request_timeout", "the request's headers did not arrive within " +
                                                                        std::to_string(o_.header_timeout_ms) + " ms"),
                                         false));
        closed = true;
        break;
      }
      if (ready <= 0 || (p[1].revents & POLLIN) != 0) {
        closed = true;  // idle, too slow, or the server is stopping
        break;
      }
      const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
      if (n <= 0) {
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        closed = true;
        break;
      }
      if (!begun) began = Clock::now();
      pending.append(chunk, static_cast<std::size_t>(n));
    }
    if (closed) break;
    if (refuse_status != 0) {
      std::lock_guard lock(conn.write_mu);
      (void)write_all_fd(fd, http_response(refuse_status, refuse_body, false));
      // A lingering close: what the client is still sending is read and dropped (for a
      // while, up to a bound), so that it gets to read the refusal instead of a reset.
      ::shutdown(fd, SHUT_WR);
      std::size_t dropped = 0;
      const auto until = Clock::now() + std::chrono::seconds(5);
      while (dropped < 2 * o_.max_body_bytes + (1u << 20) && Clock::now() < until) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 1000) <= 0) break;
        const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
        if (n <= 0) break;
        dropped += static_cast<std::size_t>(n);
      }
      break;
    }
    const auto& req = parser.get();
    HttpReply reply;
    try {
      reply = dispatch(req, conn);
    } catch (const std::exception& e) {  // (a fault of this host's: the connection ends, the host serves on)
      reply = {500, refusal("internal_error", std::string("internal error: ") + e.what())};
    }
    const unsigned status = reply.status;
    std::lock_guard lock(conn.write_mu);
    if (status == 0 || conn.answered_by_takeover) break;
    Cors cors;
    if (status != 403 && req.count(beast_http::field::origin) == 1) {  // (dispatch refuses any other)
      cors.origin = as_view(req[beast_http::field::origin]);
      cors.preflight = status == 204;
      cors.private_network = lowercase(as_view(req["Access-Control-Request-Private-Network"])) == "true";
    }
    const bool keep = req.keep_alive();
    if (!write_all_fd(fd, http_response(status, std::move(reply.body), keep, cors, reply.headers)) || !keep) break;
    began = pending.empty() ? Clock::time_point{} : Clock::now();  // (the next request: timed from its first byte)
  }
  ::close(fd);
  std::lock_guard lock(mu_);
  --active_;
  if (auto it = per_peer_.find(peer); it != per_peer_.end() && --it->second == 0) per_peer_.erase(it);
  done_.notify_all();
}

int HttpServer::run() {
  sockaddr_storage addr{};
  socklen_t addr_len = 0;
  const int port = std::stoi(o_.port);
  const std::string host = o_.host == "localhost" ? "127.0.0.1" : o_.host;
  if (auto* a4 = reinterpret_cast<sockaddr_in*>(&addr); ::inet_pton(AF_INET, host.c_str(), &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    a4->sin_port = htons(static_cast<std::uint16_t>(port));
    addr_len = sizeof(sockaddr_in);
  } else if (auto* a6 = reinterpret_cast<sockaddr_in6*>(&addr);
             ::inet_pton(AF_INET6, host.c_str(), &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons(static_cast<std::uint16_t>(port));
    addr_len = sizeof(sockaddr_in6);
  } else {
    throw ConfigError("--http: '" + o_.host + "' is not a numeric address (or localhost)");
  }
  const int listener = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&addr), addr_len) != 0 ||
      ::listen(listener, 128) != 0) {
    throw ConfigError("--http: cannot listen on " + o_.host + ":" + o_.port + ": " + std::strerror(errno));
  }
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof bound;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&bound), &bound_len);
  const unsigned actual = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  admission_.emplace(admission_rules(o_), host, actual);
  char chunk[4096];
  stop_fd_ = stop_fd_of(control_);
  const std::string url =
      "http://" + (addr.ss_family == AF_INET6 ? "[" + host + "]" : host) + ":" + std::to_string(actual);
  say("serving HTTP on " + url);
  if (control_.on_serving) control_.on_serving(url);

  for (;;) {
    pollfd p[2] = {{listener, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (::poll(p, 2, -1) < 0 && errno != EINTR) break;
    if ((p[1].revents & POLLIN) != 0) break;
    if ((p[0].revents & POLLIN) == 0) continue;
    sockaddr_storage peer_addr{};
    socklen_t peer_len = sizeof peer_addr;
    const int fd = ::accept4(listener, reinterpret_cast<sockaddr*>(&peer_addr), &peer_len, SOCK_CLOEXEC);
    if (fd < 0) continue;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::string peer = peer_text(peer_addr);
    {
      std::lock_guard lock(mu_);
      std::string why;
      if (active_ >= o_.max_connections)
        why = "too many connections";
      else if (per_peer_[peer] >= o_.max_connections_per_peer)
        why = "too many connections from " + peer + " (--http-max-connections-per-peer " +
              std::to_string(o_.max_connections_per_peer) + ")";
      if (!why.empty()) {
        if (per_peer_[peer] == 0) per_peer_.erase(peer);
        (void)write_all_fd(fd, http_response(503, refusal("overloaded", why), false));
        // What the client already sent is dropped first: closing over unread bytes would
        // reset the connection, and the refusal with it.
        ::shutdown(fd, SHUT_WR);
        for (int i = 0; i < 16 && ::recv(fd, chunk, sizeof chunk, MSG_DONTWAIT) > 0; ++i) {
        }
        ::close(fd);
        continue;
      }
      ++active_;
      ++per_peer_[peer];
    }
    std::thread([this, fd, peer = std::move(peer)] { handle(fd, peer); }).detach();
  }
  ::close(listener);
  // Connections see the stop and end; a call still running gets a little time to finish.
  std::unique_lock lock(mu_);
  if (!done_.wait_for(lock, std::chrono::seconds(5), [&] { return active_ == 0; })) return 1;
  return 0;
}

}  // namespace

void check_http_front_options(const HttpFrontOptions& options) {
  check_admission_rules(options.host, admission_rules(options));
}

int serve_http(Host& host, const HttpFrontOptions& options, const FrontControl& control) {
  check_http_front_options(options);
  HttpServer server(host, options, control);
  return server.run();
}

}  // namespace machina::cli
