// A caller's state and its updates; see ds_state.hpp.
#include <machina/ds_state.hpp>

#include <algorithm>

namespace machina {

std::shared_ptr<const Slots> CallerState::snapshot() const {
  std::lock_guard lock(mu_);
  return state_;
}

std::shared_ptr<const Slots> CallerState::apply(const DsUpdate& update) {
  std::lock_guard lock(mu_);
  if (!update.delta && update.changes.set == 0) {
    // An empty full state (what a caller sends to start clean): no copy if already empty.
    bool empty = true;
    for (const auto& slot : *state_) empty = empty && !slot.has_value();
    if (empty) return state_;
  }
  auto next = std::make_shared<Slots>(update.delta ? *state_ : Slots{});
  for (std::size_t i = 0; i < kDsSlots; ++i) {
    const auto bit = static_cast<std::uint8_t>(1u << i);
    if (update.changes.set & bit)
      (*next)[i] = update.changes.slots[i];
    else if (update.changes.removed & bit)
      (*next)[i].reset();
  }
  state_ = std::move(next);
  return state_;
}

bool CallerState::empty() const {
  const auto state = snapshot();
  return std::all_of(state->begin(), state->end(), [](const auto& slot) { return !slot.has_value(); });
}

std::shared_ptr<const SlotChanges> CallerState::as_changes() const {
  const auto state = snapshot();
  auto all = std::make_shared<SlotChanges>();
  for (std::size_t i = 0; i < kDsSlots; ++i) {
    if ((*state)[i]) {
      all->slots[i] = (*state)[i];
      all->set |= static_cast<std::uint8_t>(1u << i);
    }
  }
  if (all->empty()) return nullptr;
  return all;
}

std::shared_ptr<const SlotChanges> CallerState::commit(const SlotChanges& changes, const Slots* base) {
  if (changes.empty()) return nullptr;
  auto real_ptr = std::make_shared<SlotChanges>();
  SlotChanges& real = *real_ptr;
  std::lock_guard lock(mu_);
  const Slots& before = base != nullptr ? *base : *state_;
  auto next = std::make_shared<Slots>(*state_);
  for (std::size_t i = 0; i < kDsSlots; ++i) {
    const auto bit = static_cast<std::uint8_t>(1u << i);
    if (changes.set & bit) {
      (*next)[i] = changes.slots[i];
      if (before[i] != changes.slots[i]) {
        real.slots[i] = changes.slots[i];
        real.set |= bit;
      }
    } else if (changes.removed & bit) {
      (*next)[i].reset();
      if (before[i]) real.removed |= bit;
    }
  }
  state_ = std::move(next);
  if (real.empty()) return nullptr;
  return real_ptr;
}

}  // namespace machina
