// The name a caller most likely meant, for "did you mean …?" in refusals: a tool's aid for an
// unknown aid, a flag for an unknown flag.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace machina {

/// The name among `names` closest to `wanted` by edit distance (insertions, deletions,
/// substitutions and swaps of neighbours; letter case ignored), or "" when none is close
/// enough to be a likely slip: at most a third of `wanted`'s length, and at least 1.
/// Names longer than 256 bytes, and `wanted` beyond that, are not compared.
std::string nearest_name(std::string_view wanted, const std::vector<std::string_view>& names);

}  // namespace machina
