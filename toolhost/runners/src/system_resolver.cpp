// The C library's resolver (getaddrinfo) for the HTTP client, in programs linked
// dynamically (a statically linked one cannot load the name-service modules it needs).
#include <machina/http_client.hpp>

#include <netdb.h>

#include <cstring>

namespace machina::http {

void set_resolver(Resolver r);  // http_client.cpp

namespace {

std::vector<sockaddr_storage> resolve_system(const std::string& host, const std::string& port, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  std::vector<sockaddr_storage> out;
  if (const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    why = "cannot resolve " + host + ": " + gai_strerror(rc);
    return out;
  }
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    sockaddr_storage ss{};
    std::memcpy(&ss, a->ai_addr, std::min<std::size_t>(a->ai_addrlen, sizeof ss));
    out.push_back(ss);
  }
  ::freeaddrinfo(found);
  return out;
}

}  // namespace

void use_system_resolver() {
  set_resolver(&resolve_system);
}

}  // namespace machina::http
