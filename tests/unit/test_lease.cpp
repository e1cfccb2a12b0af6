// LeaseAuthority: tokens, single use (in memory and through the ledger shared by
// processes), and a ledger whose old windows are swept.
#include <machina/errors.hpp>
#include <machina/lease.hpp>

#include <doctest/doctest.h>

#include "temp_dir.hpp"

#include <dirent.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <string>

using namespace machina;
namespace fs = std::filesystem;

namespace {
constexpr std::int64_t kT = 1'700'000'000'000;  // a wall-clock time, ms
const std::string kSecret = "0123456789abcdef-unit-test-secret";

std::set<std::string> entries(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}
}  // namespace

TEST_CASE("a lease is good once, for its tool, until it expires") {
  LeaseAuthority authority(kSecret, {});
  const std::string token = authority.issue("AID.FILE.WRITE.v1", 1000, kT);
  CHECK(authority.redeem(token, "AID.FILE.READ.v1", kT) == "wrong_tool");
  CHECK(authority.redeem(token, "AID.FILE.WRITE.v1", kT) == std::nullopt);
  CHECK(authority.redeem(token, "AID.FILE.WRITE.v1", kT) == "consumed");
  const std::string late = authority.issue("AID.FILE.WRITE.v1", 1000, kT);
  CHECK(authority.redeem(late, "AID.FILE.WRITE.v1", kT + 1000) == "expired");
  CHECK(authority.redeem("mlt1.garbage", "AID.FILE.WRITE.v1", kT) == "malformed");
  LeaseAuthority other("another-secret-of-16-bytes-or-more", {});
  CHECK(other.redeem(authority.issue("AID.X", 1000, kT), "AID.X", kT) == "bad_signature");
  CHECK_THROWS_AS(authority.issue("AID.X", 0, kT), ConfigError);
}

TEST_CASE("the ledger makes a lease single-use across authorities (processes)") {
  TempDir ledger;
  LeaseAuthority::Options options;
  options.ledger_dir = ledger.path.string();
  LeaseAuthority first(kSecret, options), second(kSecret, options);
  const std::string token = first.issue("AID.X", 5000, kT);
  CHECK(first.redeem(token, "AID.X", kT) == std::nullopt);
  CHECK(second.redeem(token, "AID.X", kT + 1) == "consumed");
}

TEST_CASE("the ledger files leases by expiry window and sweeps windows two windows after they end") {
  TempDir ledger;
  LeaseAuthority::Options options;
  options.ledger_dir = ledger.path.string();
  options.ledger_bucket_ms = 10;
  LeaseAuthority authority(kSecret, options);
  const std::int64_t window = kT / 10;
  REQUIRE(authority.redeem(authority.issue("AID.X", 5, kT), "AID.X", kT) == std::nullopt);  // expires kT + 5
  CHECK(entries(ledger.path) == std::set<std::string>{"b" + std::to_string(window)});
  CHECK(entries(ledger.path / ("b" + std::to_string(window))).size() == 1);
  // One window later its folder is kept (a process may still be writing into it) ...
  REQUIRE(authority.redeem(authority.issue("AID.X", 5, kT + 10), "AID.X", kT + 10) == std::nullopt);
  CHECK(entries(ledger.path).count("b" + std::to_string(window)) == 1);
  // ... two windows after its start it is gone, files and all; the newer one stays.
  REQUIRE(authority.redeem(authority.issue("AID.X", 5, kT + 20), "AID.X", kT + 20) == std::nullopt);
  CHECK(entries(ledger.path) ==
        std::set<std::string>{"b" + std::to_string(window + 1), "b" + std::to_string(window + 2)});
}

TEST_CASE("lease lifetimes are checked") {
  CHECK(lease_ttl_ms(1.5, 10'000) == 1500);
  CHECK_THROWS_AS(lease_ttl_ms(0, 10'000), ConfigError);
  CHECK_THROWS_AS(lease_ttl_ms(11, 10'000), ConfigError);
}
