// SHA-256 digests written as lowercase hexadecimal: names made from content (an index, an
// environment folder, a store key) and short identities that never show the secret itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace machina {

/// `n` bytes as 2n lowercase hex digits.
std::string hex_of(const std::uint8_t* bytes, std::size_t n);

/// SHA-256 over the parts one after another (nothing between them: a caller that needs
/// the parts kept apart puts a separator among them), as the hex of the digest's first
/// `bytes` bytes (at most 32).
std::string sha256_hex(std::initializer_list<std::string_view> parts, std::size_t bytes = 32);

}  // namespace machina
