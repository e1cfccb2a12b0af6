// sha256_hex: the standard digest, its parts joined with nothing between them, cut to a prefix.
#include <machina/sha256_hex.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <string>

using namespace machina;

TEST_CASE("the digest of known texts, whole or in parts") {
  // The standard's example vectors.
  CHECK(sha256_hex({"abc"}) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex({""}) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex({}) == sha256_hex({""}));
  CHECK(sha256_hex({"a", "", "bc"}) == sha256_hex({"abc"}));
  CHECK(sha256_hex({std::string_view("a\0bc", 4)}) != sha256_hex({"abc"}));
}

TEST_CASE("a prefix of the digest, never more than the digest") {
  CHECK(sha256_hex({"abc"}, 6) == "ba7816bf8f01");
  CHECK(sha256_hex({"abc"}, 0).empty());
  CHECK(sha256_hex({"abc"}, 1000) == sha256_hex({"abc"}));
}

TEST_CASE("hex_of writes two lowercase digits per byte") {
  const std::uint8_t bytes[] = {0x00, 0x0f, 0xa0, 0xff};
  CHECK(hex_of(bytes, 4) == "000fa0ff");
  CHECK(hex_of(bytes, 0).empty());
}
