// The NATS front's pure text rules.
#include "nats_subjects.hpp"

#include <machina/errors.hpp>

#include <algorithm>
#include <cctype>
#include <unordered_map>

namespace machina::cli {

std::string without_credentials(std::string_view urls) {
  std::string out;
  while (!urls.empty()) {
    const std::size_t comma = urls.find(',');
    std::string_view url = urls.substr(0, comma);
    const std::size_t scheme = url.find("://");
    const std::size_t start = scheme == std::string_view::npos ? 0 : scheme + 3;
    const std::size_t at = url.find('@', start);
    if (!out.empty()) out.push_back(',');
    if (at != std::string_view::npos && url.find('/', start) > at) {
      out.append(url.substr(0, start)).append("***@").append(url.substr(at + 1));
    } else {
      out.append(url);
    }
    urls = comma == std::string_view::npos ? std::string_view() : urls.substr(comma + 1);
  }
  return out;
}

bool subject_safe(std::string_view s) {
  if (s.empty() || s.front() == '.' || s.back() == '.') return false;
  char prev = '.';
  for (char c : s) {
    const bool word =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    if (!word && !(c == '.' && prev != '.')) return false;
    prev = c;
  }
  return true;
}

std::string endpoint_name(std::string_view aid) {
  std::string out;
  for (char c : aid.substr(0, 200)) {
    const bool keep =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    out.push_back(keep ? c : '_');
  }
  return out.empty() ? "tool" : out;
}

std::string header_text(std::string_view text, std::size_t max) {
  if (text.size() > max) {
    std::size_t end = max;
    while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
    text = text.substr(0, end);
  }
  std::string out(text);
  for (char& c : out) {
    if (c == '\r' || c == '\n') c = ' ';
  }
  return out;
}

const char* service_error_code(const std::string& status, const std::string& code) {
  if (status == "INVALID_PICK") return code == "tool_not_found" ? "404" : "400";
  if (status == "BREAKER_TRIP" || code == "service_unavailable" || code == "audit_unavailable") return "503";
  static const std::unordered_map<std::string_view, const char*> by_code = {
      {"timeout", "504"},        {"access_denied", "403"},     {"lease_required", "401"},
      {"lease_rejected", "403"}, {"guarantee_blocked", "403"}, {"target_not_found", "404"},
      {"rate_limited", "429"},   {"overloaded", "429"},        {"idempotency_conflict", "409"}};
  const auto it = by_code.find(code);
  return it == by_code.end() ? "500" : it->second;
}

std::string typed_error(const std::string& error, const std::string& code) {
  static const std::unordered_map<std::string_view, std::string_view> by_code = [] {
    std::unordered_map<std::string_view, std::string_view> m;
    for (const auto& k : all_error_kinds()) m.emplace(k.code, k.error_type);
    return m;
  }();
  for (const auto& [_, type] : by_code) {
    if (error.size() > type.size() && error.starts_with(type) && error[type.size()] == ':') return error;
  }
  const auto it = by_code.find(code);
  const std::string_view type = it == by_code.end() ? std::string_view("SystemError") : it->second;
  // A message that starts with its type in lower case ("timeout: …") is worded once.
  if (error.size() > type.size() && error[type.size()] == ':' &&
      std::equal(type.begin(), type.end(), error.begin(),
                 [](char a, char b) { return std::tolower(static_cast<unsigned char>(a)) == b; })) {
    return std::string(type) + error.substr(type.size());
  }
  return std::string(type) + ": " + error;
}

}  // namespace machina::cli
