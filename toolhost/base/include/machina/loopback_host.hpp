// Whether a host, as a URL or an address flag names it, is one only this machine can reach:
// "localhost", or a numeric loopback address (127.0.0.0/8, ::1, ::ffff:127.x.y.z). A name is
// never taken for an address by its look: "127.example.com" is a name like any other.
#pragma once

#include <string>

namespace machina {

bool is_loopback_host(const std::string& host);

}  // namespace machina
