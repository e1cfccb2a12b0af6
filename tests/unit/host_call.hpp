// One call through Host::handle for unit tests: a request for an aid, answered with a fresh
// caller state that takes deltas.
#pragma once

#include <machina/host.hpp>

#include <string>
#include <utility>

namespace machina::test {

/// A request for `aid` with nothing else set.
inline Request to(std::string aid) {
  Request r;
  r.aid = std::move(aid);
  return r;
}

/// `req` handled by `host` for a caller of its own.
inline Response handle(Host& host, Request req) {
  CallerState session(true);
  return host.handle(req, session);
}

}  // namespace machina::test
