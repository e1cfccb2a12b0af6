// Random names made of a given alphabet: ids a client cannot guess (an MCP session's) or that
// tell instances apart (a NATS service's).
#pragma once

#include <cstddef>
#include <random>
#include <string>
#include <string_view>

namespace machina {

/// `n` characters of `alphabet`, each drawn from the system's random device.
inline std::string random_text(std::string_view alphabet, std::size_t n) {
  std::random_device rd;
  std::uniform_int_distribution<std::size_t> pick(0, alphabet.size() - 1);
  std::string out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) out.push_back(alphabet[pick(rd)]);
  return out;
}

}  // namespace machina
