// See nearest_name.hpp.
#include <machina/nearest_name.hpp>

#include <algorithm>
#include <cctype>

namespace machina {
namespace {

constexpr std::size_t kMaxCompared = 256;

char fold(char c) {
  return static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
}

/// Optimal string alignment distance (Levenshtein with swaps of neighbours), letter case
/// ignored; stops early with `limit + 1` once every alignment costs more than `limit`.
std::size_t distance(std::string_view a, std::string_view b, std::size_t limit) {
  if ((a.size() > b.size() ? a.size() - b.size() : b.size() - a.size()) > limit) return limit + 1;
  std::vector<std::size_t> before(b.size() + 1), row(b.size() + 1), next(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    next[0] = i;
    std::size_t best = next[0];
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const bool same = fold(a[i - 1]) == fold(b[j - 1]);
      std::size_t d = std::min({row[j] + 1, next[j - 1] + 1, row[j - 1] + (same ? 0 : 1)});
      if (i > 1 && j > 1 && fold(a[i - 1]) == fold(b[j - 2]) && fold(a[i - 2]) == fold(b[j - 1]))
        d = std::min(d, before[j - 2] + 1);
      next[j] = d;
      best = std::min(best, d);
    }
    if (best > limit) return limit + 1;
    std::swap(before, row);
    std::swap(row, next);
  }
  return row[b.size()];
}

}  // namespace

std::string nearest_name(std::string_view wanted, const std::vector<std::string_view>& names) {
  if (wanted.empty() || wanted.size() > kMaxCompared) return {};
  const std::size_t limit = std::max<std::size_t>(1, wanted.size() / 3);
  std::string_view best;
  std::size_t best_distance = limit + 1;
  for (std::string_view name : names) {
    if (name.size() > kMaxCompared) continue;
    const std::size_t d = distance(wanted, name, std::min(limit, best_distance));
    if (d < best_distance || (d == best_distance && !best.empty() && name < best)) {
      if (d <= limit) {
        best = name;
        best_distance = d;
      }
    }
  }
  return std::string(best);
}

}  // namespace machina
