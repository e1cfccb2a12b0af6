// The framing between the host and its isolated workers (--isolation process): length-
// prefixed binary frames in the byte order of the one machine both ends run on. A worker's
// control socket carries its greeting and news of its call processes (one ready: its pipes
// ride along as SCM_RIGHTS; one ended: how); each call process's own pipes carry its one
// call and its one result. Every decoder checks every length against the frame it reads.
#pragma once

#include <machina/call_context.hpp>
#include <machina/ds_state.hpp>
#include <machina/tool_info.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace machina::worker {

enum class FrameType : std::uint8_t { hello = 1, call = 2, result = 3, ready = 4, ended = 5, died = 6 };

/// Bytes before a frame's payload: u32 payload length, u8 type.
inline constexpr std::size_t kFrameHeader = 5;

/// The worker's first frame: the tools it registered, described in full (the host
/// registers isolated plugins' tools from this, never loading their code itself).
struct Hello {
  std::vector<ToolInfo> tools;
};

/// A call process is ready (control socket; its call pipe's two ends, its result pipe's
/// read end and its pidfd come with the frame, in that order).
struct Ready {
  std::int32_t pid = 0;  // in the worker's PID namespace: names it in `Ended`
};
inline constexpr int kReadyFds = 4;

/// A call process ended (control socket), as waitid(2) told its worker.
struct Ended {
  std::int32_t pid = 0;
  std::int32_t code = 0;    // CLD_EXITED, CLD_KILLED, CLD_DUMPED
  std::int32_t status = 0;  // the exit status or the signal
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

/// A call process that caught a fatal signal (result pipe, instead of a result): it is the
/// init of its PID namespace, which the kernel does not let die of a signal it sends
/// itself, so it says so and exits. Fixed size: written from a signal handler.
inline constexpr std::size_t kDiedFrameBytes = kFrameHeader + 4;
void encode_died(std::int32_t signal, char (&frame)[kDiedFrameBytes]) noexcept;
bool decode_died(std::string_view payload, std::int32_t& signal);

void encode_hello(const Hello& hello, std::string& out);
void encode_ready(const Ready& ready, std::string& out);
void encode_ended(const Ended& ended, std::string& out);
void encode_call(std::string_view aid, std::string_view input_json, const Slots* state, std::string& out);
void encode_result(int rc, const CallContext& call, std::string& out);

/// Decoders take one frame's payload (after the header); false if it is malformed.
bool decode_hello(std::string_view payload, Hello& out);
bool decode_ready(std::string_view payload, Ready& out);
bool decode_ended(std::string_view payload, Ended& out);
bool decode_call(std::string_view payload, Call& out);
bool decode_result(std::string_view payload, Result& out);

/// Reads the header at the start of `bytes` (at least kFrameHeader long).
void read_header(std::string_view bytes, std::uint32_t& payload_size, FrameType& type);

}  // namespace machina::worker
