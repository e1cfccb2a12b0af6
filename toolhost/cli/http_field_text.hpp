// The text of HTTP fields as the HTTP front compares it: Beast's views as standard ones,
// lowercase copies and values without their surrounding blanks.
#pragma once

#include <boost/beast/core/string.hpp>

#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>

namespace machina::cli {

inline std::string_view as_view(boost::beast::string_view v) {
  return {v.data(), v.size()};
}

inline std::string lowercase(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

/// Without the spaces and tabs around it.
inline std::string_view trimmed(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

}  // namespace machina::cli
