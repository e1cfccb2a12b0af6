// call_context (the services a tool sees through machina_host_api): output cap, error
// cut and made UTF-8, slot reads over the base state and the call's own writes, slot
// writes checked (range, cap, JSON, UTF-8), clears.
#include <machina/call_context.hpp>

#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <string_view>

using namespace machina;

namespace {
/// An artifact that borrows its texts: they must outlive it (literals do).
machina_artifact artifact(std::string_view type, std::string_view content, std::string_view provenance) {
  return machina_artifact{
      type.data(), type.size(), content.data(), content.size(), provenance.data(), provenance.size(), 7};
}

std::shared_ptr<const Slots> base_with_slot0() {
  auto slots = std::make_shared<Slots>();
  (*slots)[0] = Artifact{"text", "\"base\"", "earlier", 4};
  return slots;
}
}  // namespace

TEST_CASE("the services table names its ABI version and size") {
  const machina_host_api& api = host_api();
  CHECK(api.abi_version == MACHINA_PLUGIN_ABI_VERSION);
  CHECK(api.struct_size == sizeof(machina_host_api));
}

TEST_CASE("set_output keeps output up to the cap and flags one over it") {
  CallContext c(5, std::make_shared<const Slots>());
  const machina_host_api& api = host_api();
  CHECK(api.set_output(c.as_call(), "12345", 5) == 0);
  CHECK(c.output == "12345");
  CHECK(c.output_set);
  CHECK_FALSE(c.output_overflow);
  CHECK(api.set_output(c.as_call(), "123456", 6) == -1);
  CHECK(c.output_overflow);
  CHECK(c.output == "12345");
  CHECK_FALSE(c.set_output(std::string("toolong")));
  CHECK(c.set_output(std::string("[1]")));
  CHECK(c.output == "[1]");
}

TEST_CASE("set_error keeps at most kMaxToolErrorBytes, as valid UTF-8") {
  CallContext c(100, std::make_shared<const Slots>());
  const machina_host_api& api = host_api();
  const std::string bad = "oops \xff!";
  api.set_error(c.as_call(), bad.data(), bad.size());
  CHECK(c.error != bad);
  CHECK(c.error.rfind("oops ", 0) == 0);
  const std::string big(kMaxToolErrorBytes + 100, 'e');
  api.set_error(c.as_call(), big.data(), big.size());
  CHECK(c.error.size() == kMaxToolErrorBytes);
}

TEST_CASE("slot_get reads the base state, then the call's own writes and clears") {
  CallContext c(100, base_with_slot0());
  const machina_host_api& api = host_api();
  machina_artifact out{};
  REQUIRE(api.slot_get(c.as_call(), 0, &out) == 1);
  CHECK(std::string(out.content_json, out.content_json_len) == "\"base\"");
  CHECK(std::string(out.type, out.type_len) == "text");
  CHECK(out.size_bytes == 4);
  CHECK(api.slot_get(c.as_call(), 1, &out) == 0);
  CHECK(api.slot_get(c.as_call(), kDsSlots, &out) == -1);
  CHECK(api.slot_get(c.as_call(), 0, nullptr) == -1);

  const machina_artifact mine = artifact("json", "{\"a\":1}", "tool");
  CHECK(api.slot_set(c.as_call(), 1, &mine) == 0);
  REQUIRE(api.slot_get(c.as_call(), 1, &out) == 1);
  CHECK(std::string(out.content_json, out.content_json_len) == "{\"a\":1}");
  CHECK(out.size_bytes == 7);

  CHECK(api.slot_clear(c.as_call(), 0) == 0);
  CHECK(api.slot_get(c.as_call(), 0, &out) == 0);
  REQUIRE(c.changes);
  CHECK(c.changes->set == 0b10);
  CHECK(c.changes->removed == 0b01);
  // The base state itself is untouched.
  CHECK(c.state()[0].has_value());

  CHECK(api.slot_set(c.as_call(), 0, &mine) == 0);
  CHECK(c.changes->set == 0b11);
  CHECK(c.changes->removed == 0);
  CHECK(api.slot_clear(c.as_call(), kDsSlots) == -1);
}

TEST_CASE("slot_set refuses what a slot must not hold") {
  CallContext c(10, std::make_shared<const Slots>());
  const machina_host_api& api = host_api();
  const machina_artifact not_json = artifact("t", "{nope", "p");
  CHECK(api.slot_set(c.as_call(), 0, &not_json) == -1);
  const machina_artifact too_big = artifact("t", "\"0123456789\"", "p");
  CHECK(api.slot_set(c.as_call(), 0, &too_big) == -1);
  const std::string eleven(11, 't');
  const machina_artifact long_type = artifact(eleven, "1", "p");
  CHECK(api.slot_set(c.as_call(), 0, &long_type) == -1);
  const machina_artifact bad_type = artifact("\xc3", "1", "p");
  CHECK(api.slot_set(c.as_call(), 0, &bad_type) == -1);
  const machina_artifact bad_provenance = artifact("t", "1", "\xff");
  CHECK(api.slot_set(c.as_call(), 0, &bad_provenance) == -1);
  const machina_artifact ok = artifact("t", "1", "p");
  CHECK(api.slot_set(c.as_call(), kDsSlots, &ok) == -1);
  CHECK(api.slot_set(c.as_call(), 0, nullptr) == -1);
  // What is refused is not written.
  CHECK_FALSE(c.changes);
  CHECK(api.slot_set(c.as_call(), 7, &ok) == 0);
  CHECK(c.changes->set == 0x80);
}

TEST_CASE("a call over a session reads the session's state") {
  CallerState session(false);
  SlotChanges changes;
  changes.slots[2] = Artifact{"text", "\"kept\"", "earlier call", 6};
  changes.set = 0b100;
  session.commit(changes);
  CallContext c(100, &session);
  machina_artifact out{};
  REQUIRE(host_api().slot_get(c.as_call(), 2, &out) == 1);
  CHECK(std::string(out.content_json, out.content_json_len) == "\"kept\"");
  CHECK(host_api().slot_get(c.as_call(), 0, &out) == 0);
}
