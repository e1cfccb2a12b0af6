// The NDJSON wire seen from a client: encoding requests and reading responses, as the
// Python pool and spawn transports do. The inverse of ndjson_wire.hpp: both ends of the
// protocol are tested and fuzzed against each other.
#pragma once

#include <machina/request.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace machina {

/// Appends one request line (ending in '\n'). `id` is written when set; `ds_state_json`,
/// when set, must be a JSON object (it is copied as it is).
void encode_request(const Request& request, std::optional<std::int64_t> id, std::string_view ds_state_json,
                    std::string& out);

/// One response as a client reads it. Strings are decoded; `ds_state` is the raw text of
/// the response's ds_state object (a view into the decoded text), empty if it had none.
struct ResponseFields {
  std::optional<std::int64_t> id;
  bool ok = false;
  std::optional<std::string> status;
  std::string output_json;
  std::string error;
  std::optional<std::string> code;
  bool idempotent_hit = false;
  std::string_view ds_state;
  std::string_view trace;  // the raw text of the response's trace object, empty if none
  std::optional<std::int64_t> lease_tier;
  std::optional<std::string> lease_aid;
  std::optional<std::string> lease_reason;
  std::optional<std::string> hint;  // what the caller can do about the failure
};

/// Decodes one response line (without its '\n'). False, with `why`, if it is not a
/// response object (not JSON, not an object, a known field of the wrong type, no `ok`).
bool decode_response(std::string_view text, ResponseFields& out, std::string& why);

/// The delta (as a --serve session answers it) that turns the full state `before` into the
/// full state `after`, both as ds_state JSON objects; "" when they hold the same. A client
/// of --run, which answers with full states, reports changes as every other transport does
/// with it. False, with `why`, if either is not a ds_state.
bool delta_between(std::string_view before, std::string_view after, std::string& out, std::string& why);

/// A response stream that can no longer be trusted (a line that is not a response, an
/// answer to no open request): the client must give up on the connection.
class StreamError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The requests of one connection still waiting for their answers, as the response
/// matcher needs to see them.
class OpenRequests {
 public:
  virtual ~OpenRequests() = default;
  /// Whether `id` was sent and not yet answered.
  virtual bool is_open(std::int64_t id) const = 0;
  /// The open ids, oldest first, until `visit` returns false.
  virtual void oldest_first(const std::function<bool(std::int64_t)>& visit) const = 0;
};

/// Reads every complete response line of `text` from `start` and hands each to `take`
/// with the id it answers; returns where the first incomplete line starts. A response
/// without an id (the host could not read that request: over the size cap) answers the
/// oldest request still open, since the host sends such an answer only once every earlier
/// request is answered. Throws StreamError for a line that is not a response, or that
/// answers an id not open (or answered earlier in `text`).
std::size_t match_responses(std::string_view text, std::size_t start, const OpenRequests& open,
                            const std::function<void(std::int64_t, const ResponseFields&)>& take);

/// What one lock-step exchange with a --serve host did (see round_trip).
struct RoundTrip {
  enum class Status { done, end_of_output, out_of_time, write_failed };
  Status status = Status::done;
  std::size_t written = 0;  // bytes of the request written
  std::string data;         // everything read (at least one whole line when done)
};

/// Writes `request` whole to the host's stdin while reading its stdout (the host may be
/// waiting for answers to be read), then reads until at least one whole line is in or
/// `until` passes. Both descriptors must be non-blocking. `written_all` runs once, when
/// the writing ends (however it ends), so that the caller can let other writers in. Once
/// the request is written, polls for the answer for up to `spin` before sleeping in poll():
/// a quick tool's answer then costs no wake-up (never when this process may use only one CPU).
RoundTrip round_trip(int fd_in, int fd_out, std::string_view request, std::chrono::steady_clock::time_point until,
                     std::chrono::microseconds spin, const std::function<void()>& written_all);

}  // namespace machina
