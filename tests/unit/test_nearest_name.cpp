// nearest_name: the likely slip among known names, or none when nothing is close.
#include <machina/nearest_name.hpp>

#include <doctest/doctest.h>

#include <string>

using namespace machina;

TEST_CASE("a slip of a letter, a swap or a case finds the name meant") {
  const std::vector<std::string_view> aids = {"AID.ECHO.v1", "AID.TEXT.STATS.v1", "AID.FILE.READ.v1"};
  CHECK(nearest_name("AID.ECH0.v1", aids) == "AID.ECHO.v1");             // substitution
  CHECK(nearest_name("AID.EHCO.v1", aids) == "AID.ECHO.v1");             // neighbours swapped
  CHECK(nearest_name("aid.echo.v1", aids) == "AID.ECHO.v1");             // case
  CHECK(nearest_name("AID.TEXT.STAT.v1", aids) == "AID.TEXT.STATS.v1");  // deletion
}

TEST_CASE("nothing close enough, nothing empty, nothing huge: no suggestion") {
  const std::vector<std::string_view> aids = {"AID.ECHO.v1"};
  CHECK(nearest_name("AID.NOPE.v1", aids).empty());  // 4 edits in 11 letters
  CHECK(nearest_name("", aids).empty());
  CHECK(nearest_name(std::string(300, 'A'), aids).empty());
  CHECK(nearest_name("AID.ECHO.v1", {}).empty());
  CHECK(nearest_name("ab", {"ac"}) == "ac");  // one edit is always allowed
}

TEST_CASE("of two equally near names the first in byte order is chosen") {
  CHECK(nearest_name("abd", {"abe", "abc"}) == "abc");
}
