// Session state updates; see ds_state.hpp.
#include <machina/ds_state.hpp>

namespace machina {

std::shared_ptr<const Slots> Session::snapshot() const {
  std::lock_guard lock(mu_);
  return state_;
}

void Session::apply(const DsUpdate& update) {
  std::lock_guard lock(mu_);
  auto next = std::make_shared<Slots>(update.delta ? *state_ : Slots{});
  for (std::size_t i = 0; i < kDsSlots; ++i) {
    const auto bit = static_cast<std::uint8_t>(1u << i);
    if (update.changes.set & bit) (*next)[i] = update.changes.slots[i];
    else if (update.changes.removed & bit) (*next)[i].reset();
  }
  state_ = std::move(next);
}

std::shared_ptr<const SlotChanges> Session::as_changes() const {
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

std::shared_ptr<const SlotChanges> Session::commit(const SlotChanges& changes) {
  if (changes.empty()) return nullptr;
  auto real_ptr = std::make_shared<SlotChanges>();
  SlotChanges& real = *real_ptr;
  std::lock_guard lock(mu_);
  auto next = std::make_shared<Slots>(*state_);
  for (std::size_t i = 0; i < kDsSlots; ++i) {
    const auto bit = static_cast<std::uint8_t>(1u << i);
    auto& slot = (*next)[i];
    if (changes.set & bit) {
      if (slot != changes.slots[i]) {
        slot = changes.slots[i];
        real.slots[i] = slot;
        real.set |= bit;
      }
    } else if ((changes.removed & bit) && slot) {
      slot.reset();
      real.removed |= bit;
    }
  }
  if (real.empty()) return nullptr;
  state_ = std::move(next);
  return real_ptr;
}

}  // namespace machina
