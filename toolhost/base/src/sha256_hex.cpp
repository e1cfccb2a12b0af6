// See sha256_hex.hpp.
#include <machina/sha256_hex.hpp>

#include <nettle/sha2.h>

#include <algorithm>

namespace machina {

std::string hex_of(const std::uint8_t* bytes, std::size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (std::size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[bytes[i] >> 4];
    out[2 * i + 1] = kDigits[bytes[i] & 15];
  }
  return out;
}

std::string sha256_hex(std::initializer_list<std::string_view> parts, std::size_t bytes) {
  sha256_ctx ctx;
  sha256_init(&ctx);
  for (std::string_view part : parts)
    sha256_update(&ctx, part.size(), reinterpret_cast<const std::uint8_t*>(part.data()));
  std::uint8_t digest[SHA256_DIGEST_SIZE];
  sha256_digest(&ctx, sizeof digest, digest);
  return hex_of(digest, std::min<std::size_t>(bytes, sizeof digest));
}

}  // namespace machina
