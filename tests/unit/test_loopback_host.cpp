// is_loopback_host: localhost and numeric loopback addresses only; a name that merely looks
// like a loopback address is a name.
#include <machina/loopback_host.hpp>

#include <doctest/doctest.h>

using machina::is_loopback_host;

TEST_CASE("loopback: localhost and numeric loopback addresses") {
  for (const char* host : {"localhost", "127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1"}) {
    CAPTURE(host);
    CHECK(is_loopback_host(host));
  }
}

TEST_CASE("not loopback: other addresses, and names that look like loopback addresses") {
  for (const char* host : {"127.example.com", "127.0.0.1.nip.io", "localhost.example.com", "10.0.0.1", "0.0.0.0",
                           "::", "::ffff:10.0.0.1", "example.com", "", "[::1]"}) {
    CAPTURE(host);
    CHECK_FALSE(is_loopback_host(host));
  }
}
