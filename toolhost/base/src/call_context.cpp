// The machina_host_api functions; see call_context.hpp.
#include <machina/call_context.hpp>
#include <machina/json_text.hpp>

namespace machina {
namespace {

CallContext& ctx(machina_call* call) {
  return *reinterpret_cast<CallContext*>(call);
}

int api_set_output(machina_call* call, const char* json, std::size_t len) {
  return ctx(call).set_output(std::string_view(json, len)) ? 0 : -1;
}

void api_set_error(machina_call* call, const char* message, std::size_t len) {
  ctx(call).error = to_valid_utf8(std::string_view(message, std::min(len, kMaxToolErrorBytes)));
}

int api_slot_get(machina_call* call, std::uint32_t slot, machina_artifact* out) {
  if (slot >= kDsSlots || out == nullptr) return -1;
  CallContext& c = ctx(call);
  const auto bit = static_cast<std::uint8_t>(1u << slot);
  const std::optional<Artifact>* a = nullptr;
  if (c.changes && (c.changes->set & bit))
    a = &c.changes->slots[slot];
  else if (!c.changes || !(c.changes->removed & bit))
    a = &c.state()[slot];
  if (a == nullptr || !a->has_value()) return 0;
  const Artifact& v = **a;
  *out = machina_artifact{v.type.data(),       v.type.size(),       v.content_json.data(), v.content_json.size(),
                          v.provenance.data(), v.provenance.size(), v.size_bytes};
  return 1;
}

int api_slot_set(machina_call* call, std::uint32_t slot, const machina_artifact* a) {
  if (slot >= kDsSlots || a == nullptr) return -1;
  CallContext& c = ctx(call);
  const std::string_view type(a->type, a->type_len), content(a->content_json, a->content_json_len),
      provenance(a->provenance, a->provenance_len);
  // Slots are bounded like outputs: a tool cannot grow the session's state without limit.
  if (content.size() > c.max_output || type.size() > c.max_output || provenance.size() > c.max_output) return -1;
  if (!is_valid_utf8(type) || !is_valid_utf8(provenance) || !validate_json(content)) return -1;
  const auto bit = static_cast<std::uint8_t>(1u << slot);
  SlotChanges& w = c.writes();
  w.slots[slot] = Artifact{std::string(type), std::string(content), std::string(provenance), a->size_bytes};
  w.set |= bit;
  w.removed &= static_cast<std::uint8_t>(~bit);
  return 0;
}

int api_slot_clear(machina_call* call, std::uint32_t slot) {
  if (slot >= kDsSlots) return -1;
  CallContext& c = ctx(call);
  const auto bit = static_cast<std::uint8_t>(1u << slot);
  SlotChanges& w = c.writes();
  w.slots[slot].reset();
  w.set &= static_cast<std::uint8_t>(~bit);
  w.removed |= bit;
  return 0;
}

const machina_host_api kHostApi{MACHINA_PLUGIN_ABI_VERSION,
                                sizeof(machina_host_api),
                                &api_set_output,
                                &api_set_error,
                                &api_slot_get,
                                &api_slot_set,
                                &api_slot_clear};

}  // namespace

const Slots& CallContext::state() {
  if (!base) base = session_ != nullptr ? session_->snapshot() : std::make_shared<const Slots>();
  return *base;
}

SlotChanges& CallContext::writes() {
  if (!changes) changes = std::make_unique<SlotChanges>();
  return *changes;
}

const machina_host_api& host_api() noexcept {
  return kHostApi;
}

}  // namespace machina
