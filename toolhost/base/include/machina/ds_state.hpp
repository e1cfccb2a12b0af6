// ds_state: eight artifact slots (DS0..DS7) shared between a caller and its tools,
// sent in full or as a delta, and answered with what the tool changed.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace machina {

inline constexpr std::size_t kDsSlots = 8;

struct Artifact {
  std::string type;
  std::string content_json;
  std::string provenance;
  std::uint64_t size_bytes = 0;
  bool operator==(const Artifact&) const = default;
};

using Slots = std::array<std::optional<Artifact>, kDsSlots>;

/// Changes to a state: slots set (bit in `set`) and slots emptied (bit in `removed`).
struct SlotChanges {
  Slots slots;
  std::uint8_t set = 0;
  std::uint8_t removed = 0;
  bool empty() const { return set == 0 && removed == 0; }
};

/// A ds_state as a request sends it: a full state, or a delta against the session's.
struct DsUpdate {
  bool delta = false;
  SlotChanges changes;  // full: `set` marks every present slot, the rest are emptied
  /// The request named its slots "0".."7" (removed_slots as integers), as the dispatch
  /// client does, rather than "DS0".."DS7": its response is written the same way.
  bool numbered = false;
};

/// The ds_state a response carries. `changes` is shared (a response is copied into
/// the idempotency cache) and null when there is nothing to report.
struct DsReport {
  enum class Mode { none, delta, full };
  Mode mode = Mode::none;
  std::shared_ptr<const SlotChanges> changes;  // delta: what the tool changed; full: the state
  bool numbered = false;                       // slots "0".."7", removed_slots as integers
};

/// One caller's state. Serve mode keeps one per stream and answers with deltas;
/// single-shot mode answers with the full state. Thread-safe.
class CallerState {
 public:
  explicit CallerState(bool respond_with_delta) : delta_(respond_with_delta) {}
  bool respond_with_delta() const { return delta_; }

  std::shared_ptr<const Slots> snapshot() const;
  /// Applies a request's state; returns the state as it is right after (what that
  /// request's call runs with, whatever calls on other threads do to the session).
  std::shared_ptr<const Slots> apply(const DsUpdate& update);
  /// Applies a tool's changes and returns those that really changed the state (null if
  /// none did). `base`: the state the call ran with; changes are judged against it (the
  /// session's current state if null), so concurrent calls each get their own delta.
  std::shared_ptr<const SlotChanges> commit(const SlotChanges& changes, const Slots* base = nullptr);

  /// The whole state as changes against an empty one (null if empty).
  std::shared_ptr<const SlotChanges> as_changes() const;
  /// Whether every slot is empty.
  bool empty() const;

 private:
  bool delta_;
  mutable std::mutex mu_;
  std::shared_ptr<const Slots> state_ = std::make_shared<const Slots>();
};

}  // namespace machina
