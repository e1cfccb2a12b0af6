// The built-in plugin, loaded when no plugin is named: echo, text statistics, JSON
// pointer lookup and ds_state slot tools. (The file tools are the host's file pack:
// toolhost/runners/src/packs/.)
#include <machina/plugin.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>

#include <unistd.h>

namespace {

using json = nlohmann::json;
using machina::plugin::Call;
using machina::plugin::Registry;
using machina::plugin::Result;

Result reply(Call& call, const json& out) {
  // The host refuses oversized output itself; a false return needs no handling here.
  call.output(out.dump());
  return Result::ok;
}

Result echo(Call& call) {
  call.output(call.input());
  return Result::ok;
}

// Counts code points, bytes, words and lines; optionally the most frequent words.
Result text_stats(Call& call) {
  const json in = json::parse(call.input());
  const auto& text = in.at("text").get_ref<const std::string&>();
  const std::size_t top = in.value("top", 0);
  std::size_t chars = 0, lines = text.empty() ? 0 : 1;
  std::map<std::string, std::size_t> counts;
  std::string word;
  std::size_t words = 0;
  auto end_word = [&] {
    if (word.empty()) return;
    ++words;
    if (top > 0) ++counts[word];
    word.clear();
  };
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if ((u & 0xC0) != 0x80) ++chars;
    if (c == '\n') ++lines;
    if (std::isspace(u))
      end_word();
    else
      word.push_back(u < 0x80 ? static_cast<char>(std::tolower(u)) : c);
  }
  end_word();
  if (!text.empty() && text.back() == '\n') --lines;
  json out{{"chars", chars}, {"bytes", text.size()}, {"words", words}, {"lines", lines}};
  if (top > 0) {
    std::vector<std::pair<std::string, std::size_t>> ranked(counts.begin(), counts.end());
    std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    if (ranked.size() > top) ranked.resize(top);
    json list = json::array();
    for (const auto& [w, n] : ranked) list.push_back({{"word", w}, {"count", n}});
    out["top_words"] = list;
  }
  return reply(call, out);
}

Result json_pointer(Call& call) {
  const json in = json::parse(call.input());
  json::json_pointer ptr;
  try {
    ptr = json::json_pointer(in.at("pointer").get<std::string>());
  } catch (const json::exception&) {
    return call.fail("pointer is not a valid JSON pointer (RFC 6901)");
  }
  const json& doc = in.at("document");
  try {
    if (doc.contains(ptr)) return reply(call, {{"found", true}, {"value", doc.at(ptr)}});
  } catch (const json::exception&) {
    // e.g. an array index too large to represent: nothing can be there
  }
  return reply(call, {{"found", false}});
}

std::string slot_name(std::uint32_t i) {
  return "DS" + std::to_string(i);
}

Result state_put(Call& call) {
  const json in = json::parse(call.input());
  const auto slot = in.at("slot").get<std::uint32_t>();
  const std::string content = in.at("content").dump();
  const std::string type = in.at("type").get<std::string>();
  const std::string provenance = in.value("provenance", std::string("AID.STATE.PUT.v1"));
  if (!call.set_slot(slot, {type, content, provenance, content.size()})) return call.fail("slot could not be set");
  return reply(call, {{"slot", slot_name(slot)}, {"size_bytes", content.size()}});
}

Result state_get(Call& call) {
  const json in = json::parse(call.input());
  const auto slot = in.at("slot").get<std::uint32_t>();
  const auto a = call.slot(slot);
  if (!a) return reply(call, {{"slot", slot_name(slot)}, {"present", false}});
  return reply(call, {{"slot", slot_name(slot)},
                      {"present", true},
                      {"type", a->type},
                      {"content", json::parse(a->content_json)},
                      {"provenance", a->provenance},
                      {"size_bytes", a->size_bytes}});
}

Result state_clear(Call& call) {
  const json in = json::parse(call.input());
  const auto slot = in.at("slot").get<std::uint32_t>();
  const bool was_present = call.slot(slot).has_value();
  call.clear_slot(slot);
  return reply(call, {{"slot", slot_name(slot)}, {"cleared", was_present}});
}

const char* kSlotSchema =
    R"({"type":"object","properties":{"slot":{"type":"integer","minimum":0,"maximum":7}},"required":["slot"]})";

void fill(Registry& r) {
  r.tool("AID.ECHO.v1", echo)
      .name("echo")
      .description("Returns its input unchanged.")
      .deterministic()
      .tags({"debug"})
      .replay_inputs();
  r.tool("AID.TEXT.STATS.v1", text_stats)
      .name("text_stats")
      .description("Counts characters, bytes, words and lines of a text; optionally its most frequent words.")
      .input_schema(R"({"type":"object","properties":{"text":{"type":"string"},)"
                    R"("top":{"type":"integer","minimum":0,"maximum":100}},)"
                    R"("required":["text"],"additionalProperties":false})")
      .deterministic()
      .tags({"text"})
      .replay_inputs();
  r.tool("AID.JSON.POINTER.v1", json_pointer)
      .name("json_pointer")
      .description("Looks up an RFC 6901 JSON pointer in a document.")
      .input_schema(R"({"type":"object","properties":{"document":{},"pointer":{"type":"string"}},)"
                    R"("required":["document","pointer"],"additionalProperties":false})")
      .deterministic()
      .tags({"json"})
      .replay_inputs();
  r.tool("AID.STATE.PUT.v1", state_put)
      .name("state_put")
      .description("Stores a JSON value as an artifact in a ds_state slot (0-7).")
      .input_schema(R"({"type":"object","properties":{"slot":{"type":"integer","minimum":0,"maximum":7},)"
                    R"("type":{"type":"string","minLength":1},"content":{},"provenance":{"type":"string"}},)"
                    R"("required":["slot","type","content"],"additionalProperties":false})")
      .deterministic()
      .tags({"state"})
      .side_effects({"ds_state"})
      .replay_inputs();
  r.tool("AID.STATE.GET.v1", state_get)
      .name("state_get")
      .description("Reads the artifact in a ds_state slot (0-7).")
      .input_schema(kSlotSchema)
      .tags({"state"});
  r.tool("AID.STATE.CLEAR.v1", state_clear)
      .name("state_clear")
      .description("Empties a ds_state slot (0-7).")
      .input_schema(kSlotSchema)
      .deterministic()
      .tags({"state"})
      .side_effects({"ds_state"})
      .replay_inputs();
}

}  // namespace

MACHINA_PLUGIN(fill)
