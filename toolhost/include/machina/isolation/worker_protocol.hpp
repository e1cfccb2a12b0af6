// The framing between the host and its isolated worker processes (--isolation process):
// length-prefixed binary frames over a pair of pipes, in the byte order of the one machine
// both ends run on. Every decoder checks every length against the frame it reads.
#pragma once

#include <machina/call_context.hpp>
#include <machina/ds_state.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace machina::worker {

enum class FrameType : std::uint8_t { hello = 1, call = 2, result = 3 };

/// Bytes before a frame's payload: u32 payload length, u8 type.
inline constexpr std::size_t kFrameHeader = 5;

/// The worker's first frame: which tools it registered.
struct Hello {
  std::vector<std::string> aids;
};

/// One call, host → worker.
struct Call {
  std::string aid;
  std::string input_json;
  std::shared_ptr<const Slots> state;  // null: empty
};

/// One call's outcome, worker → host.
struct Result {
  int rc = 0;
  bool output_set = false;
  bool output_overflow = false;
  std::string output;
  std::string error;
  SlotChanges changes;
};

void encode_hello(const Hello& hello, std::string& out);
void encode_call(std::string_view aid, std::string_view input_json, const Slots* state, std::string& out);
void encode_result(int rc, const CallContext& call, std::string& out);

/// Decoders take one frame's payload (after the header); false if it is malformed.
bool decode_hello(std::string_view payload, Hello& out);
bool decode_call(std::string_view payload, Call& out);
bool decode_result(std::string_view payload, Result& out);

/// Reads the header at the start of `bytes` (at least kFrameHeader long).
void read_header(std::string_view bytes, std::uint32_t& payload_size, FrameType& type);

}  // namespace machina::worker
