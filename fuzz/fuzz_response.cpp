// Fuzz target: the client's response decoder (what the Python pool reads from a host).
// Never crashes; what it accepts has its ds_state slice inside the input.
#include <machina/ndjson_client.hpp>

#include <cstdint>
#include <cstdlib>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  machina::ResponseFields fields;
  std::string why;
  if (machina::decode_response(text, fields, why)) {
    if (!fields.ds_state.empty() &&
        (fields.ds_state.data() < text.data() || fields.ds_state.data() + fields.ds_state.size() > text.data() + size))
      std::abort();
  } else if (why.empty()) {
    std::abort();
  }
  return 0;
}
