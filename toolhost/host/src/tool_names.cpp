// See tool_names.hpp.
#include <machina/tool.hpp>
#include <machina/tool_names.hpp>

#include <nettle/sha2.h>

#include <cstdint>
#include <unordered_set>

namespace machina {
namespace {

constexpr std::size_t kMaxName = 64;
constexpr std::size_t kHashDigits = 12;                       // of SHA-256's hex: hashed names stay apart
constexpr std::size_t kMaxStem = kMaxName - kHashDigits - 1;  // room for '-' and the digits

bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

/// Bytes of the UTF-8 character at the start of `s` (1 for a byte that starts none).
std::size_t char_length(std::string_view s) {
  const auto lead = static_cast<unsigned char>(s[0]);
  const std::size_t n = lead < 0xC0 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : lead < 0xF8 ? 4 : 1;
  if (n > s.size()) return 1;
  for (std::size_t i = 1; i < n; ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) return 1;
  }
  return n;
}

std::string hex_digest(std::string_view text, std::size_t digits) {
  sha256_ctx ctx;
  sha256_init(&ctx);
  sha256_update(&ctx, text.size(), reinterpret_cast<const std::uint8_t*>(text.data()));
  std::uint8_t digest[SHA256_DIGEST_SIZE];
  sha256_digest(&ctx, SHA256_DIGEST_SIZE, digest);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; out.size() < digits; ++i) {
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 0xF]);
  }
  out.resize(digits);
  return out;
}

nlohmann::ordered_json any_object() {
  return {{"type", "object"}};
}

/// `text` as a JSON object schema ({"type": "object", ...}), else null.
nlohmann::ordered_json object_schema(std::string_view text) {
  if (text.empty()) return nullptr;
  auto s = nlohmann::ordered_json::parse(text, nullptr, false);
  if (!s.is_object() || !s.contains("type") || s["type"] != "object") return nullptr;
  return s;
}

}  // namespace

bool plain_llm_name(std::string_view aid) {
  if (aid.empty() || aid.size() > kMaxName) return false;
  for (char c : aid) {
    if (c == '-' || !(name_char(c) || c == '.')) return false;
  }
  return true;
}

std::string llm_function_name(std::string_view aid, unsigned salt) {
  if (plain_llm_name(aid)) {
    std::string out(aid);
    for (char& c : out) {
      if (c == '.') c = '-';
    }
    return out;
  }
  std::string stem;
  for (std::size_t at = 0; at < aid.size() && stem.size() < kMaxStem;) {
    const std::size_t n = char_length(aid.substr(at));
    const char c = aid[at];
    stem.push_back(n == 1 && c == '.' ? '-' : n == 1 && name_char(c) ? c : '_');
    at += n;
  }
  const std::string digest = hex_digest(std::to_string(salt) + ":" + std::string(aid), kHashDigits);
  return (stem.empty() ? std::string("tool") : stem) + "-" + digest;
}

std::vector<std::string> llm_function_names(const std::vector<std::string_view>& aids) {
  std::vector<std::string> names(aids.size());
  std::unordered_set<std::string> taken;
  for (std::size_t i = 0; i < aids.size(); ++i) {
    if (!plain_llm_name(aids[i])) continue;
    names[i] = llm_function_name(aids[i]);
    taken.insert(names[i]);
  }
  // A hashed name gives way to a plain one, and to the hashed names before it.
  std::unordered_map<std::string_view, std::size_t> first;
  for (std::size_t i = 0; i < aids.size(); ++i) {
    if (plain_llm_name(aids[i])) continue;
    if (auto [it, added] = first.emplace(aids[i], i); !added) {
      names[i] = names[it->second];
      continue;
    }
    unsigned salt = 0;
    while (!taken.insert(names[i] = llm_function_name(aids[i], salt)).second) ++salt;
  }
  return names;
}

void ToolNames::rebuild(const std::vector<const Tool*>& tools) {
  by_display_name_.clear();
  by_llm_name_.clear();
  llm_name_of_.clear();
  std::vector<std::string_view> aids;
  aids.reserve(tools.size());
  for (const Tool* t : tools) {
    if (!t->info.name.empty()) by_display_name_[t->info.name].push_back(t);  // ("" names no tool)
    aids.push_back(t->info.aid);
  }
  const std::vector<std::string> names = llm_function_names(aids);
  for (std::size_t i = 0; i < tools.size(); ++i) {
    by_llm_name_.emplace(names[i], tools[i]);
    llm_name_of_.emplace(tools[i], names[i]);
  }
}

ToolNames::Found ToolNames::find(std::string_view name) const {
  // An LLM function name before a display name: display names are what hosted servers call
  // their tools, and so cannot take the name a model calls another tool by.
  if (auto it = by_llm_name_.find(name); it != by_llm_name_.end()) return {it->second, {}};
  const auto it = by_display_name_.find(name);
  if (it == by_display_name_.end()) return {};
  if (it->second.size() == 1) return {it->second.front(), {}};
  return {nullptr, it->second};
}

std::string ToolNames::llm_name(const Tool& tool) const {
  const auto it = llm_name_of_.find(&tool);
  return it == llm_name_of_.end() ? std::string() : it->second;
}

const std::string& declared_input_schema(const ToolInfo& info) {
  return info.input_schema.empty() ? info.listed_schema : info.input_schema;
}

nlohmann::ordered_json advertised_input_schema(std::string_view schema_text) {
  nlohmann::ordered_json s = object_schema(schema_text);
  return s.is_null() ? any_object() : s;
}

nlohmann::ordered_json advertised_input_schema(const ToolInfo& info) {
  return advertised_input_schema(declared_input_schema(info));
}

nlohmann::ordered_json advertised_output_schema(const ToolInfo& info) {
  return object_schema(info.output_schema);
}

nlohmann::ordered_json advertised_annotations(const ToolInfo& info) {
  const bool read_only = info.tier == 0 && info.side_effects.empty();
  const bool destructive = !read_only && info.tier >= 2;
  if (!info.annotations.empty()) {
    auto a = nlohmann::ordered_json::parse(info.annotations, nullptr, false);
    if (a.is_object()) {
      if (!read_only) a["readOnlyHint"] = false;
      if (destructive) a["destructiveHint"] = true;
      return a;
    }
  }
  return {{"readOnlyHint", read_only},
          {"destructiveHint", destructive},
          {"idempotentHint", read_only || info.deterministic}};
}

}  // namespace machina
