// Strings for the tests of the in-place string scanner (rapid_sax.hpp): it reads sixteen
// bytes at a time from wherever a string starts, so every length across two blocks, with
// something else put in at every place.
#pragma once

#include <string>
#include <vector>

namespace machina::test {

/// Strings of 0 to 34 letters with one of `inserts` put in at each place (every third
/// place past 20 letters).
inline std::vector<std::string> strings_with_inserts(const std::vector<std::string>& inserts) {
  std::vector<std::string> out;
  for (std::size_t length = 0; length <= 34; ++length) {
    for (const std::string& insert : inserts) {
      for (std::size_t at = 0; at <= length; at += (length > 20 ? 3 : 1)) {
        std::string value(length, 'a');
        for (std::size_t i = 0; i < length; ++i) value[i] = static_cast<char>('a' + i % 26);
        value.insert(at, insert);
        out.push_back(std::move(value));
      }
    }
  }
  return out;
}

}  // namespace machina::test
