// A ds_state object on its own: decoded (through the request decoder, so the rules are
// one) and encoded, as a report of the slots a call set and removed.
#include <machina/ds_state_codec.hpp>
#include <machina/json_text.hpp>
#include <machina/ndjson_wire.hpp>

#include <charconv>
#include <string>

namespace machina {
namespace {

void append_artifact(std::string& out, const Artifact& a) {
  append_literal(out, "{\"type\":");
  append_json_string(out, a.type);
  append_literal(out, ",\"content_json\":");
  append_json_string(out, a.content_json);
  append_literal(out, ",\"provenance\":");
  append_json_string(out, a.provenance);
  append_literal(out, ",\"size_bytes\":");
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, a.size_bytes);
  (void)ec;
  out.append(buf, end);
  out.push_back('}');
}

void append_slots(std::string& out, const SlotChanges* changes, bool numbered) {
  out.push_back('{');
  bool first = true;
  for (std::size_t i = 0; changes != nullptr && i < kDsSlots; ++i) {
    if (!(changes->set & (1u << i)) || !changes->slots[i]) continue;
    if (!first) out.push_back(',');
    first = false;
    if (numbered)
      out.push_back('"');
    else
      append_literal(out, "\"DS");
    out.push_back(static_cast<char>('0' + i));
    append_literal(out, "\":");
    append_artifact(out, *changes->slots[i]);
  }
  out.push_back('}');
}

}  // namespace

bool decode_ds_state(std::string_view text, DsUpdate& update, std::string& why) {
  Request req;
  Response err;
  std::string wrapped;
  wrapped.reserve(text.size() + 16);
  wrapped.append("{\"ds_state\":").append(text).push_back('}');
  if (!decode_request(wrapped, req, err, false, /*aid_required=*/false)) {
    why = err.error;
    return false;
  }
  update = req.ds_state.value_or(DsUpdate{});
  return true;
}

void encode_ds_state(const DsReport& report, std::string& out) {
  if (report.mode == DsReport::Mode::full) {
    append_literal(out, "{\"slots\":");
    append_slots(out, report.changes.get(), report.numbered);
    out.push_back('}');
    return;
  }
  if (!report.changes) {  // most calls change nothing
    append_literal(out, "{\"delta\":true,\"slots\":{},\"removed_slots\":[]}");
    return;
  }
  append_literal(out, "{\"delta\":true,\"slots\":");
  append_slots(out, report.changes.get(), report.numbered);
  append_literal(out, ",\"removed_slots\":[");
  bool first = true;
  const std::uint8_t removed = report.changes->removed;
  for (std::size_t i = 0; i < kDsSlots; ++i) {
    if (!(removed & (1u << i))) continue;
    if (!first) out.push_back(',');
    first = false;
    if (report.numbered) {
      out.push_back(static_cast<char>('0' + i));
      continue;
    }
    append_literal(out, "\"DS");
    out.push_back(static_cast<char>('0' + i));
    out.push_back('"');
  }
  append_literal(out, "]}");
}

}  // namespace machina
