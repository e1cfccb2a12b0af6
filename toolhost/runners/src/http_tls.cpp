// TLS for the HTTP client (https service URLs), with OpenSSL over the client's own
// non-blocking sockets: TLS 1.2 or later, the peer's certificate verified against the
// system's store or the origin's CA file, and verified to be for the URL's host (its name,
// or its address for a numeric host). Linked only into the programs that install it, which
// ignore SIGPIPE: OpenSSL writes to the socket with write(2).
#include <machina/clock.hpp>
#include <machina/http_client.hpp>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <arpa/inet.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace machina::http {

void set_tls(TlsFactory f);  // http_client.cpp

namespace {

/// The oldest error OpenSSL queued on this thread (the queue emptied), or `fallback`.
std::string openssl_error(const std::string& fallback) {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return fallback;
  char text[256];
  ERR_error_string_n(e, text, sizeof text);
  return text;
}

bool is_address(const std::string& host) {
  unsigned char buf[16];
  return ::inet_pton(AF_INET, host.c_str(), buf) == 1 || ::inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

class OpenSslSession final : public TlsSession {
 public:
  explicit OpenSslSession(SSL* ssl) : ssl_(ssl) {}
  ~OpenSslSession() override {
    if (!broken_) SSL_shutdown(ssl_);  // close_notify, once, without waiting for the peer's
    SSL_free(ssl_);
  }
  OpenSslSession(const OpenSslSession&) = delete;
  OpenSslSession& operator=(const OpenSslSession&) = delete;

  Io write(const char* data, std::size_t size, std::size_t& n, std::string& why) override {
    return outcome(SSL_write_ex(ssl_, data, size, &n), why);
  }
  Io read(char* data, std::size_t size, std::size_t& n, std::string& why) override {
    return outcome(SSL_read_ex(ssl_, data, size, &n), why);
  }
  bool pending() const override { return SSL_pending(ssl_) > 0; }

 private:
  Io outcome(int rc, std::string& why) {
    if (rc == 1) return Io::done;
    switch (SSL_get_error(ssl_, rc)) {
      case SSL_ERROR_WANT_READ: return Io::want_read;
      case SSL_ERROR_WANT_WRITE: return Io::want_write;
      case SSL_ERROR_ZERO_RETURN: return Io::closed;
      case SSL_ERROR_SYSCALL:
        broken_ = true;
        why = errno != 0 ? std::strerror(errno) : "the connection was closed";
        ERR_clear_error();
        return errno != 0 ? Io::failed : Io::closed;
      default:
        broken_ = true;
        why = "TLS: " + openssl_error("a protocol error");
        return Io::failed;
    }
  }

  SSL* ssl_;
  bool broken_ = false;
};

class OpenSslContext final : public TlsContext {
 public:
  explicit OpenSslContext(SSL_CTX* ctx) : ctx_(ctx) {}
  ~OpenSslContext() override { SSL_CTX_free(ctx_); }
  OpenSslContext(const OpenSslContext&) = delete;
  OpenSslContext& operator=(const OpenSslContext&) = delete;

  std::unique_ptr<TlsSession> handshake(int fd, const Url& url, std::int64_t deadline_ms, Reply::Failure& failure,
                                        std::string& why) override {
    failure = Reply::Failure::unreachable;
    ERR_clear_error();
    SSL* ssl = SSL_new(ctx_);
    if (ssl == nullptr) {
      why = "cannot start TLS: " + openssl_error("out of memory");
      return nullptr;
    }
    auto session = std::make_unique<OpenSslSession>(ssl);
    SSL_set_fd(ssl, fd);
    const bool address = is_address(url.host);
    if (address) {
      X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), url.host.c_str());
    } else {
      SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
      SSL_set1_host(ssl, url.host.c_str());
      SSL_set_tlsext_host_name(ssl, url.host.c_str());
    }
    for (;;) {
      errno = 0;
      const int rc = SSL_connect(ssl);
      if (rc == 1) return session;
      const int err = SSL_get_error(ssl, rc);
      if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
        pollfd p{fd, static_cast<short>(err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT), 0};
        const auto left = std::clamp<std::int64_t>(deadline_ms - steady_now_ms(), 0, 1 << 30);
        if (::poll(&p, 1, static_cast<int>(left)) == 0) {
          failure = Reply::Failure::timed_out;
          why = "no TLS handshake with " + url.origin() + " before the deadline";
          return nullptr;
        }
        continue;
      }
      break;
    }
    const long verify = SSL_get_verify_result(ssl);
    if (verify == X509_V_ERR_HOSTNAME_MISMATCH || verify == X509_V_ERR_IP_ADDRESS_MISMATCH) {
      why = "certificate verify failed: the certificate is not for " + url.host + " (host name mismatch)";
    } else if (verify != X509_V_OK) {
      why = std::string("certificate verify failed: ") + X509_verify_cert_error_string(verify);
    } else {
      why = openssl_error(errno != 0 ? std::strerror(errno) : "the connection was closed");
    }
    ERR_clear_error();
    why = "the TLS handshake with " + url.origin() + " failed: " + why;
    return nullptr;
  }

 private:
  SSL_CTX* ctx_;
};

std::unique_ptr<TlsContext> make_context(const std::string& ca_file, std::string& why) {
  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  if (ctx == nullptr) {
    why = "cannot start TLS: " + openssl_error("out of memory");
    return nullptr;
  }
  auto context = std::make_unique<OpenSslContext>(ctx);
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  // A server that closes without TLS's close_notify ends a body read to the close as a
  // plain close would; a body with a length that is cut short is still caught.
  SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
  if (ca_file.empty()) {
    SSL_CTX_set_default_verify_paths(ctx);
  } else if (SSL_CTX_load_verify_locations(ctx, ca_file.c_str(), nullptr) != 1) {
    why = "cannot load the CA file " + ca_file + ": " + openssl_error("no certificate in it");
    return nullptr;
  }
  return context;
}

}  // namespace

void use_tls() {
  set_tls(&make_context);
}

}  // namespace machina::http
