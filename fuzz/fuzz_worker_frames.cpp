// Fuzz target: the frames between a host and its isolated workers (calls, results,
// greetings, control news), decoded from bytes a compromised worker (or host) could send. Never crashes or reads out of
// bounds; what decodes re-encodes to the same bytes.
#include <machina/isolation/worker_protocol.hpp>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view payload(reinterpret_cast<const char*>(data), size);
  machina::worker::Call call;
  if (machina::worker::decode_call(payload, call)) {
    std::string out;
    machina::worker::encode_call(call.aid, call.input_json, call.state.get(), out);
    if (std::string_view(out).substr(machina::worker::kFrameHeader) != payload) std::abort();
  }
  machina::worker::Result result;
  (void)machina::worker::decode_result(payload, result);
  machina::worker::Hello hello;
  (void)machina::worker::decode_hello(payload, hello);
  machina::worker::Ready ready;
  if (machina::worker::decode_ready(payload, ready)) {
    std::string out;
    machina::worker::encode_ready(ready, out);
    if (std::string_view(out).substr(machina::worker::kFrameHeader) != payload) std::abort();
  }
  machina::worker::Ended ended;
  if (machina::worker::decode_ended(payload, ended)) {
    std::string out;
    machina::worker::encode_ended(ended, out);
    if (std::string_view(out).substr(machina::worker::kFrameHeader) != payload) std::abort();
  }
  std::int32_t signal = 0;
  (void)machina::worker::decode_died(payload, signal);
  return 0;
}
