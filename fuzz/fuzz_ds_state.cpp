// Fuzz target: the ds_state decoder. Never crashes; a decoded state applied to a session
// and encoded again decodes to the same state.
#include <machina/ds_state.hpp>
#include <machina/ds_state_codec.hpp>

#include <cstdint>
#include <cstdlib>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  machina::DsUpdate update;
  std::string why;
  if (!machina::decode_ds_state(text, update, why)) {
    if (why.empty()) std::abort();  // every refusal says why
    return 0;
  }
  machina::CallerState session(/*respond_with_delta=*/false);
  session.apply(update);
  std::string full;
  machina::encode_ds_state({machina::DsReport::Mode::full, session.as_changes()}, full);
  machina::DsUpdate again;
  if (!machina::decode_ds_state(full, again, why)) std::abort();
  machina::CallerState copy(false);
  copy.apply(again);
  if (*copy.snapshot() != *session.snapshot()) std::abort();
  return 0;
}
