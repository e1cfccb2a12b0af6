// See worker_protocol.hpp.
#include <machina/isolation/worker_protocol.hpp>

#include <cstring>

namespace machina::worker {
namespace {

template <class T>
void put(std::string& out, T v) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));
  out.append(buf, sizeof(T));
}

void put_str(std::string& out, std::string_view s) {
  put<std::uint64_t>(out, s.size());
  out.append(s);
}

void put_artifact(std::string& out, const Artifact& a) {
  put_str(out, a.type);
  put_str(out, a.content_json);
  put_str(out, a.provenance);
  put<std::uint64_t>(out, a.size_bytes);
}

void put_strings(std::string& out, const std::vector<std::string>& items) {
  put<std::uint32_t>(out, static_cast<std::uint32_t>(items.size()));
  for (const auto& s : items) put_str(out, s);
}

std::size_t begin(std::string& out, FrameType type) {
  const std::size_t at = out.size();
  put<std::uint32_t>(out, 0);
  put<std::uint8_t>(out, static_cast<std::uint8_t>(type));
  return at;
}

void finish(std::string& out, std::size_t at) {
  const auto size = static_cast<std::uint32_t>(out.size() - at - kFrameHeader);
  std::memcpy(out.data() + at, &size, sizeof size);
}

/// Bounds-checked reading of one payload.
class Cursor {
 public:
  explicit Cursor(std::string_view bytes) : rest_(bytes) {}

  template <class T>
  bool get(T& v) {
    if (rest_.size() < sizeof(T)) return false;
    std::memcpy(&v, rest_.data(), sizeof(T));
    rest_.remove_prefix(sizeof(T));
    return true;
  }
  bool get_str(std::string& s) {
    std::uint64_t n = 0;
    if (!get(n) || n > rest_.size()) return false;
    s.assign(rest_.data(), static_cast<std::size_t>(n));
    rest_.remove_prefix(static_cast<std::size_t>(n));
    return true;
  }
  bool get_strings(std::vector<std::string>& items) {
    std::uint32_t n = 0;
    if (!get(n) || n > rest_.size()) return false;  // each string takes at least 8 bytes
    items.resize(n);
    for (auto& s : items) {
      if (!get_str(s)) return false;
    }
    return true;
  }
  bool get_artifact(Artifact& a) {
    return get_str(a.type) && get_str(a.content_json) && get_str(a.provenance) && get(a.size_bytes);
  }
  bool done() const { return rest_.empty(); }

 private:
  std::string_view rest_;
};

bool get_slots(Cursor& c, std::uint8_t mask, Slots& slots) {
  for (std::size_t i = 0; i < kDsSlots; ++i) {
    if (!(mask & (1u << i))) continue;
    Artifact a;
    if (!c.get_artifact(a)) return false;
    slots[i] = std::move(a);
  }
  return true;
}

}  // namespace

void read_header(std::string_view bytes, std::uint32_t& payload_size, FrameType& type) {
  std::memcpy(&payload_size, bytes.data(), sizeof payload_size);
  type = static_cast<FrameType>(static_cast<std::uint8_t>(bytes[4]));
}

void encode_hello(const Hello& hello, std::string& out) {
  const auto at = begin(out, FrameType::hello);
  put<std::uint32_t>(out, static_cast<std::uint32_t>(hello.tools.size()));
  for (const auto& t : hello.tools) {
    for (const std::string* s : {&t.aid, &t.name, &t.description, &t.input_schema, &t.plugin_path}) put_str(out, *s);
    put_strings(out, t.tags);
    put_strings(out, t.side_effects);
    put<std::uint8_t>(out, static_cast<std::uint8_t>((t.deterministic ? 1 : 0) | (t.replay_inputs ? 2 : 0)));
    put<std::int32_t>(out, t.tier);
    put<std::uint32_t>(out, t.default_timeout_ms);
  }
  finish(out, at);
}

void encode_died(std::int32_t signal, char (&frame)[kDiedFrameBytes]) noexcept {
  const std::uint32_t size = 4;
  std::memcpy(frame, &size, sizeof size);
  frame[4] = static_cast<char>(FrameType::died);
  std::memcpy(frame + kFrameHeader, &signal, sizeof signal);
}

bool decode_died(std::string_view payload, std::int32_t& signal) {
  Cursor c(payload);
  return c.get(signal) && c.done();
}

void encode_ready(const Ready& ready, std::string& out) {
  const auto at = begin(out, FrameType::ready);
  put(out, ready.pid);
  finish(out, at);
}

void encode_ended(const Ended& ended, std::string& out) {
  const auto at = begin(out, FrameType::ended);
  put(out, ended.pid);
  put(out, ended.code);
  put(out, ended.status);
  finish(out, at);
}

void encode_call(std::string_view aid, std::string_view input_json, const Slots* state, std::string& out) {
  const auto at = begin(out, FrameType::call);
  put_str(out, aid);
  put_str(out, input_json);
  std::uint8_t mask = 0;
  for (std::size_t i = 0; state != nullptr && i < kDsSlots; ++i) {
    if ((*state)[i]) mask |= static_cast<std::uint8_t>(1u << i);
  }
  put(out, mask);
  for (std::size_t i = 0; i < kDsSlots; ++i) {
    if (mask & (1u << i)) put_artifact(out, *(*state)[i]);
  }
  finish(out, at);
}

void encode_result(int rc, const CallContext& call, std::string& out) {
  const auto at = begin(out, FrameType::result);
  put<std::int32_t>(out, rc);
  put<std::uint8_t>(out, static_cast<std::uint8_t>((call.output_set ? 1 : 0) | (call.output_overflow ? 2 : 0)));
  put_str(out, call.output);
  put_str(out, call.error);
  const std::uint8_t set = call.changes ? call.changes->set : 0;
  const std::uint8_t removed = call.changes ? call.changes->removed : 0;
  put(out, set);
  put(out, removed);
  for (std::size_t i = 0; i < kDsSlots; ++i) {
    if (set & (1u << i)) put_artifact(out, *call.changes->slots[i]);
  }
  finish(out, at);
}

bool decode_hello(std::string_view payload, Hello& out) {
  Cursor c(payload);
  std::uint32_t n = 0;
  if (!c.get(n)) return false;
  out.tools.clear();
  for (std::uint32_t i = 0; i < n; ++i) {
    ToolInfo t;
    std::uint8_t flags = 0;
    std::int32_t tier = 0;
    for (std::string* s : {&t.aid, &t.name, &t.description, &t.input_schema, &t.plugin_path}) {
      if (!c.get_str(*s)) return false;
    }
    if (!c.get_strings(t.tags) || !c.get_strings(t.side_effects) || !c.get(flags) || !c.get(tier) ||
        !c.get(t.default_timeout_ms)) {
      return false;
    }
    t.deterministic = flags & 1;
    t.replay_inputs = flags & 2;
    t.tier = tier;
    out.tools.push_back(std::move(t));
  }
  return c.done();
}

bool decode_ready(std::string_view payload, Ready& out) {
  Cursor c(payload);
  return c.get(out.pid) && c.done();
}

bool decode_ended(std::string_view payload, Ended& out) {
  Cursor c(payload);
  return c.get(out.pid) && c.get(out.code) && c.get(out.status) && c.done();
}

bool decode_call(std::string_view payload, Call& out) {
  Cursor c(payload);
  std::uint8_t mask = 0;
  if (!c.get_str(out.aid) || !c.get_str(out.input_json) || !c.get(mask)) return false;
  out.state = nullptr;
  if (mask != 0) {
    auto slots = std::make_shared<Slots>();
    if (!get_slots(c, mask, *slots)) return false;
    out.state = std::move(slots);
  }
  return c.done();
}

bool decode_result(std::string_view payload, Result& out) {
  Cursor c(payload);
  std::int32_t rc = 0;
  std::uint8_t flags = 0;
  if (!c.get(rc) || !c.get(flags) || !c.get_str(out.output) || !c.get_str(out.error)) return false;
  out.rc = rc;
  out.output_set = flags & 1;
  out.output_overflow = flags & 2;
  out.changes = SlotChanges{};
  if (!c.get(out.changes.set) || !c.get(out.changes.removed)) return false;
  if (out.changes.set & out.changes.removed) return false;
  if (!get_slots(c, out.changes.set, out.changes.slots)) return false;
  return c.done();
}

}  // namespace machina::worker
