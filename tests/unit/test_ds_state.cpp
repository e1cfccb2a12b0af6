// CallerState: a caller's ds_state, full and delta updates, and the changes a call reports.
#include <machina/ds_state.hpp>

#include <doctest/doctest.h>

using namespace machina;

namespace {
Artifact art(std::string content) {
  return Artifact{"t", content, "", content.size()};
}
}  // namespace

TEST_CASE("a full update replaces the state, a delta changes only what it names") {
  CallerState s(true);
  DsUpdate full;
  full.changes.slots[0] = art("1");
  full.changes.slots[1] = art("2");
  full.changes.set = 0b11;
  s.apply(full);
  DsUpdate delta;
  delta.delta = true;
  delta.changes.removed = 0b1;
  delta.changes.slots[5] = art("5");
  delta.changes.set = 1u << 5;
  const auto after = s.apply(delta);
  CHECK_FALSE((*after)[0].has_value());
  CHECK((*after)[1] == art("2"));
  CHECK((*after)[5] == art("5"));
  DsUpdate empty_full;
  CHECK(s.apply(empty_full)->at(1) == std::nullopt);
}

TEST_CASE("commit reports only real changes, judged against the state the call ran with") {
  CallerState s(true);
  SlotChanges put;
  put.slots[2] = art("x");
  put.set = 1u << 2;
  const auto base = s.snapshot();
  auto changed = s.commit(put, base.get());
  REQUIRE(changed);
  CHECK(changed->set == (1u << 2));
  const auto base2 = s.snapshot();
  CHECK(s.commit(put, base2.get()) == nullptr);  // the same artifact again: no change
  SlotChanges clear;
  clear.removed = 1u << 2;
  changed = s.commit(clear, s.snapshot().get());
  REQUIRE(changed);
  CHECK(changed->removed == (1u << 2));
  CHECK(s.as_changes() == nullptr);  // empty again
}
