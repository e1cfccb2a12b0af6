// A word of an aid made from a name: the packs' and hosted servers' tools are registered
// under aids built of such words (AID.PACK.<ID>.<TOOL>.v1, AID.SKILL.<NAME>.<TOOL>.v1).
#pragma once

#include <cctype>
#include <string>
#include <string_view>

namespace machina {

/// `s` in capitals, every character but letters and digits turned into '_'.
inline std::string aid_word(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    out.push_back(std::isalnum(static_cast<unsigned char>(c))
                      ? static_cast<char>(std::toupper(static_cast<unsigned char>(c)))
                      : '_');
  }
  return out;
}

}  // namespace machina
