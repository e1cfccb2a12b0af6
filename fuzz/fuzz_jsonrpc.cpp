// Fuzz target: JSON-RPC 2.0 lines as the --mcp and --skill fronts and the skill runner read
// them (from clients and from children, neither trusted). Never crashes; every raw part it
// cuts out (id, params, result, error.data, a member's or element's text) lies inside the
// line; a message's kind agrees with what it has; an id found in a line's first bytes is
// text of the line.
#include <machina/jsonrpc.hpp>

#include <cstdint>
#include <cstdlib>
#include <string>

namespace {
bool inside(std::string_view part, const std::string& text) {
  return part.empty() || (part.data() >= text.data() && part.data() + part.size() <= text.data() + text.size());
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace machina::jsonrpc;
  const std::string text(reinterpret_cast<const char*>(data), size);
  Message m;
  std::string why;
  if (parse(text, m, why)) {
    for (std::string_view part : {m.id, m.params, m.result, m.error_data}) {
      if (!inside(part, text)) std::abort();
    }
    if (m.kind == Message::Kind::request && (m.id.empty() || m.id == "null")) std::abort();
    if (m.kind == Message::Kind::notification && !m.id.empty()) std::abort();
    if (m.kind == Message::Kind::invalid && m.why.empty()) std::abort();
    const std::string head_id = find_id(text.substr(0, 64));
    if (!head_id.empty() && text.find(head_id) == std::string::npos) std::abort();
    // The members of its params, and of each object or array among them.
    auto check = [&](const Member& member) {
      if (!inside(member.raw, text) || member.raw.empty()) std::abort();
      return true;
    };
    if (!m.params.empty()) {
      std::string w;
      for_each_member(m.params, check, w);
      for_each_element(m.params, check, w);
    }
  } else if (why.empty()) {
    std::abort();
  }
  std::string w;
  for_each_member(text, [&](const Member& member) { return inside(member.raw, text) || (std::abort(), false); }, w);
  for_each_element(text, [&](const Member& member) { return inside(member.raw, text) || (std::abort(), false); }, w);
  return 0;
}
