// The decoder of a request's ds_state object, fed the SAX events of its contents by the
// request decoder (ndjson_request_decode.cpp): the slots it sets and removes, checked
// field by field.
#pragma once

#include <machina/json_text.hpp>
#include <machina/request.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace machina::detail {

/// The slot a name stands for: "DS0".."DS7", or "0".."7" (`numbered` says which form).
inline int slot_index(std::string_view name, bool& numbered) {
  if (name.size() == 3 && name[0] == 'D' && name[1] == 'S' && name[2] >= '0' && name[2] <= '7') {
    numbered = false;
    return name[2] - '0';
  }
  if (name.size() == 1 && name[0] >= '0' && name[0] <= '7') {
    numbered = true;
    return name[0] - '0';
  }
  return -1;
}

/// Decodes a ds_state object. Fed the events of the object's contents; reports its
/// own errors (kind invalid_ds_state) through `fail`.
class DsStateDecoder {
 public:
  explicit DsStateDecoder(DsUpdate& out) : out_(out) {}

  // Events; `depth` is relative: 1 = inside the ds_state object.
  bool key(int depth, std::string_view k) {
    if (depth == 1) {
      if (k == "delta")
        field_ = Field::delta;
      else if (k == "slots")
        field_ = Field::slots;
      else if (k == "removed_slots")
        field_ = Field::removed_slots;
      else
        return fail("unknown field '" + excerpt(k) + "'");
      const auto bit = 1u << static_cast<unsigned>(field_);
      if (seen_ & bit) return fail("duplicate field '" + std::string(k) + "'");
      seen_ |= bit;
      return true;
    }
    if (depth == 2) {  // slot name inside "slots"
      bool numbered = false;
      slot_ = slot_index(k, numbered);
      if (slot_ < 0) return fail("unknown slot '" + excerpt(k) + "' (slots are DS0..DS7, or 0..7)");
      if (!same_form(numbered)) return false;
      if (out_.changes.set & (1u << slot_)) return fail("duplicate slot " + std::string(k));
      artifact_ = Artifact{};
      artifact_seen_ = 0;
      return true;
    }
    // depth 3: artifact field
    if (k == "type")
      afield_ = AField::type;
    else if (k == "content_json")
      afield_ = AField::content_json;
    else if (k == "provenance")
      afield_ = AField::provenance;
    else if (k == "size_bytes")
      afield_ = AField::size_bytes;
    else
      return fail(slot_name() + ": unknown field '" + excerpt(k) + "'");
    const auto bit = 1u << static_cast<unsigned>(afield_);
    if (artifact_seen_ & bit) return fail(slot_name() + ": duplicate field '" + std::string(k) + "'");
    artifact_seen_ |= bit;
    return true;
  }

  bool start_container(int depth, bool object) {
    if (depth == 1 && field_ == Field::slots && object) return true;
    if (depth == 1 && field_ == Field::removed_slots && !object) return true;
    if (depth == 2 && field_ == Field::slots && object) return true;
    return wrong_type(depth);
  }

  bool end_container(int depth) {
    if (depth == 2 && field_ == Field::slots) return finish_artifact();
    return true;
  }

  bool string(int depth, std::string_view v) {
    if (depth == 2 && field_ == Field::removed_slots) {
      bool numbered = false;
      const int i = slot_index(v, numbered);
      if (i < 0) return fail("unknown slot '" + excerpt(v) + "' in removed_slots (slots are DS0..DS7, or 0..7)");
      return same_form(numbered) && remove(i);
    }
    if (depth == 3) {
      switch (afield_) {
        case AField::type: artifact_.type.assign(v); return true;
        case AField::content_json: artifact_.content_json.assign(v); return true;
        case AField::provenance: artifact_.provenance.assign(v); return true;
        case AField::size_bytes: break;
      }
    }
    return wrong_type(depth);
  }

  bool boolean(int depth, bool v) {
    if (depth == 1 && field_ == Field::delta) {
      out_.delta = v;
      return true;
    }
    return wrong_type(depth);
  }

  bool unsigned_number(int depth, std::uint64_t v) {
    if (depth == 3 && afield_ == AField::size_bytes) {
      artifact_.size_bytes = v;
      return true;
    }
    if (depth == 2 && field_ == Field::removed_slots) {  // the dispatch client's integers
      if (v >= kDsSlots) return fail("unknown slot " + std::to_string(v) + " in removed_slots (slots are 0..7)");
      return same_form(true) && remove(static_cast<int>(v));
    }
    return wrong_type(depth);
  }

  bool other(int depth) { return wrong_type(depth); }

  bool finish() {
    if (!out_.delta && (seen_ & (1u << static_cast<unsigned>(Field::removed_slots))))
      return fail("'removed_slots' needs \"delta\": true");
    if (out_.changes.set & out_.changes.removed) return fail("a slot is both set and removed");
    return true;
  }

  const std::string& error() const { return error_; }

 private:
  enum class Field { delta, slots, removed_slots };
  enum class AField { type, content_json, provenance, size_bytes };

  std::string slot_name() const { return "slot DS" + std::to_string(slot_); }

  /// One request names its slots one way: "DS0".."DS7" or "0".."7" (its answer uses it).
  bool same_form(bool numbered) {
    if (form_seen_ && out_.numbered != numbered)
      return fail("slots are named both as DS0..DS7 and as 0..7: use one form");
    form_seen_ = true;
    out_.numbered = numbered;
    return true;
  }

  bool remove(int slot) {
    out_.changes.removed |= static_cast<std::uint8_t>(1u << slot);
    return true;
  }

  bool finish_artifact() {
    constexpr unsigned need =
        (1u << static_cast<unsigned>(AField::type)) | (1u << static_cast<unsigned>(AField::content_json));
    if ((artifact_seen_ & need) != need) return fail(slot_name() + ": 'type' and 'content_json' are required");
    std::string why;
    if (!validate_json(artifact_.content_json, &why))
      return fail(slot_name() + ": content_json is not JSON (" + why + ")");
    if (!(artifact_seen_ & (1u << static_cast<unsigned>(AField::size_bytes))))
      artifact_.size_bytes = artifact_.content_json.size();
    out_.changes.slots[static_cast<std::size_t>(slot_)] = std::move(artifact_);
    out_.changes.set |= static_cast<std::uint8_t>(1u << slot_);
    return true;
  }

  // `depth`: 1 = a value of the ds_state object, 2 = a slot (or removed_slots
  // element), 3 = a field of an artifact.
  bool wrong_type(int depth) {
    if (depth == 1) {
      switch (field_) {
        case Field::delta: return fail("'delta' must be a boolean");
        case Field::slots: return fail("'slots' must be an object mapping slot names to artifacts");
        case Field::removed_slots:
          return fail("'removed_slots' must be an array of slot names (DS0..DS7) or numbers (0..7)");
      }
    }
    if (depth == 2) {
      if (field_ == Field::removed_slots)
        return fail("'removed_slots' must be an array of slot names (DS0..DS7) or numbers (0..7)");
      return fail(slot_name() + " must be an artifact object");
    }
    switch (afield_) {
      case AField::size_bytes: return fail(slot_name() + ": 'size_bytes' must be a non-negative integer");
      case AField::type: return fail(slot_name() + ": 'type' must be a string");
      case AField::content_json: return fail(slot_name() + ": 'content_json' must be a string");
      case AField::provenance: return fail(slot_name() + ": 'provenance' must be a string");
    }
    return fail("bad value");
  }

  bool fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    return false;
  }

  DsUpdate& out_;
  Field field_ = Field::delta;
  unsigned seen_ = 0;
  int slot_ = -1;
  Artifact artifact_;
  AField afield_ = AField::type;
  unsigned artifact_seen_ = 0;
  bool form_seen_ = false;
  std::string error_;
};

}  // namespace machina::detail
