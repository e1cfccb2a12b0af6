// The line server of the stdio fronts, generic over a line codec: bounded line reading,
// calls run on one thread or on N worker threads, responses in request order (those with
// an id may overtake), output batched until the reader would block, and the overrun sink of
// a thread stuck in a tool past its deadline. Each stdio front is a codec: NDJSON
// (--serve, codecs/ndjson_codec) and MCP or skill JSON-RPC (--mcp, --skill,
// codecs/mcp_skill_codec).
#pragma once

#include <machina/fd_io.hpp>
#include <machina/host.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <string_view>

namespace machina::cli {

/// A wire format spoken one line at a time.
class LineCodec {
 public:
  struct Handled {
    bool has_id = false;   // the output may overtake earlier lines' (--workers)
    bool overran = false;  // the host answered through the overrun sink: nothing appended
  };
  /// What the reader does with a line before any call is made of it.
  enum class Peek {
    handle,           // hand it to handle() (on a serving thread)
    done,             // peek() dealt with it (a cancellation): nothing more
    handle_then_stop  // handle it, then read no further (the skill front's shutdown)
  };
  /// Writes whole lines to the output at once, between responses (MCP's progress
  /// notifications); thread-safe.
  using WriteNow = std::function<void(std::string_view lines)>;

  virtual ~LineCodec() = default;
  /// Answers one line (appending zero or more output lines to `out`), calling the host
  /// with `overrun_sink` for the calls it makes. `line.data()[line.size()]` is '\0'.
  virtual Handled handle(Host& host, std::string_view line, CallerState& session, std::string& out,
                         OverrunSink* overrun_sink) = 0;
  /// The answer to a line longer than the host's request cap: `head` is its start (at most
  /// LineReader::kHeadBytes; the rest is never read).
  virtual void answer_too_large(Host& host, std::string_view head, std::string& out) = 0;
  /// Encodes a response the host delivered through an overrun sink.
  virtual void encode(const Response& response, std::string& out) = 0;
  /// Called by the reader for every line as it is read, before any line after it is read
  /// (so while earlier calls still run). `line` is as handle() gets it.
  virtual Peek peek(std::string_view /*line*/) { return Peek::handle; }
  /// Where out-of-band lines go; set by serve() before the first line.
  virtual void attach(WriteNow /*write_now*/) {}
};

struct ServeOptions {
  int in_fd = 0;
  int out_fd = 1;
  unsigned workers = 1;
  std::size_t max_in_flight = 1024;   // bound on requests read but not yet answered
  std::chrono::microseconds spin{0};  // how long to poll for the next request before sleeping
  bool state_per_call = false;        // each request runs with the state it carries, or none
};

/// Serves until end of input; returns the process exit code.
int serve(Host& host, LineCodec& codec, const ServeOptions& options);

}  // namespace machina::cli
