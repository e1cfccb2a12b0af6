// http_tls (https for the HTTP client, OpenSSL): against a TLS server thread written here
// with a certificate made for the test, a request over TLS is answered; a certificate for
// another host, one not signed by the CA given, a server that speaks no TLS and a CA file
// that cannot be loaded each fail their own way; without use_tls() https is refused.
#include <machina/clock.hpp>
#include <machina/http_client.hpp>

#include <doctest/doctest.h>

#include "temp_dir.hpp"
#include "tiny_http_server.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

using namespace machina::http;

namespace {

/// A self-signed certificate (it is its own CA) for `san` (e.g. "IP:127.0.0.1"), and its key.
bool make_certificate(const TempDir& dir, const std::string& name, const std::string& san) {
  const std::string base = (dir.path / name).string();
  const std::string command =
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 "
      "-subj /CN=machina-test -addext subjectAltName=" +
      san + " -keyout " + base + ".key -out " + base + ".pem >/dev/null 2>&1";
  return std::system(command.c_str()) == 0;
}

/// A server on 127.0.0.1: each connection gets a TLS handshake (with `tls`) and one answer
/// to its request, or (without) the answer in plain text.
struct TlsServer {
  int listener = -1;
  int port = 0;
  SSL_CTX* ctx = nullptr;
  std::thread thread;

  TlsServer(const std::string& cert, const std::string& key, bool tls) {
    if (tls) {
      ctx = SSL_CTX_new(TLS_server_method());
      REQUIRE(SSL_CTX_use_certificate_file(ctx, cert.c_str(), SSL_FILETYPE_PEM) == 1);
      REQUIRE(SSL_CTX_use_PrivateKey_file(ctx, key.c_str(), SSL_FILETYPE_PEM) == 1);
    }
    listener = machina::test::loopback_listener(port);
    thread = std::thread([this] {
      for (int fd; (fd = ::accept(listener, nullptr, nullptr)) >= 0; ::close(fd)) serve(fd);
    });
  }
  ~TlsServer() {
    ::shutdown(listener, SHUT_RDWR);
    ::close(listener);
    thread.join();
    if (ctx != nullptr) SSL_CTX_free(ctx);
  }

  void serve(int fd) {
    const std::string reply = "HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nsecret";
    if (ctx == nullptr) {
      char buf[4096];
      (void)!::read(fd, buf, sizeof buf);
      (void)!::write(fd, reply.data(), reply.size());
      return;
    }
    SSL* ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    if (SSL_accept(ssl) == 1) {
      std::string in;
      char buf[4096];
      while (in.find("\r\n\r\n") == std::string::npos) {
        const int n = SSL_read(ssl, buf, sizeof buf);
        if (n <= 0) break;
        in.append(buf, static_cast<std::size_t>(n));
      }
      SSL_write(ssl, reply.data(), static_cast<int>(reply.size()));
      SSL_shutdown(ssl);
    }
    SSL_free(ssl);
    ERR_clear_error();
  }
};

Reply post(const std::string& host, int port, const std::string& ca_file) {
  Client client(Url{host, std::to_string(port), "/", true}, ca_file);
  return client.post("/", "{}", {}, machina::steady_now_ms() + 5000, 1 << 10);
}

}  // namespace

TEST_CASE("without use_tls an https origin is refused") {
  Client client(Url{"127.0.0.1", "443", "/", true});
  CHECK(client.unusable() == "this program does not speak https");
  const Reply r = client.post("/", "{}", {}, machina::steady_now_ms() + 1000, 1 << 10);
  CHECK(r.failure == Reply::Failure::unreachable);
  CHECK(r.detail == "https://127.0.0.1:443: this program does not speak https");
}

TEST_CASE("https: verified against the CA file, for the URL's host") {
  use_tls();
  TempDir dir;
  REQUIRE(make_certificate(dir, "ip", "IP:127.0.0.1"));
  REQUIRE(make_certificate(dir, "other", "DNS:other.example"));
  const std::string ip = (dir.path / "ip").string(), other = (dir.path / "other").string();

  {
    TlsServer server(ip + ".pem", ip + ".key", true);
    Reply r = post("127.0.0.1", server.port, ip + ".pem");
    REQUIRE_MESSAGE(r.failure == Reply::Failure::none, r.detail);
    CHECK(r.status == 200);
    CHECK(r.body == "secret");

    // Signed by another CA than the one given.
    r = post("127.0.0.1", server.port, other + ".pem");
    CHECK(r.failure != Reply::Failure::none);
    CHECK(r.detail.find("certificate verify failed") != std::string::npos);
    CHECK(r.body.empty());
  }
  {
    // A certificate for another host, signed by the CA given.
    TlsServer server(other + ".pem", other + ".key", true);
    const Reply r = post("127.0.0.1", server.port, other + ".pem");
    CHECK(r.failure != Reply::Failure::none);
    CHECK(r.detail.find("the certificate is not for 127.0.0.1 (host name mismatch)") != std::string::npos);
  }
  {
    // A server that answers in plain text.
    TlsServer server("", "", false);
    const Reply r = post("127.0.0.1", server.port, ip + ".pem");
    CHECK(r.failure != Reply::Failure::none);
    CHECK(r.detail.find("the TLS handshake with https://127.0.0.1:" + std::to_string(server.port) + " failed") !=
          std::string::npos);
    CHECK(r.body.empty());
  }
  // A CA file that cannot be loaded.
  std::ofstream(dir.path / "empty.pem") << "not a certificate\n";
  Client broken(Url{"127.0.0.1", "443", "/", true}, (dir.path / "empty.pem").string());
  CHECK(broken.unusable().find("cannot load the CA file " + (dir.path / "empty.pem").string()) == 0);
  Client missing(Url{"127.0.0.1", "443", "/", true}, (dir.path / "none.pem").string());
  CHECK(missing.unusable().find("cannot load the CA file") == 0);
}
