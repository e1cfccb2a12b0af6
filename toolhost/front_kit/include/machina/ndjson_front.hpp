// The dispatch wire format (docs/protocol.md) as a front: one NDJSON request in, one response line out, around
// Host::handle. What --run and --serve speak, and what _core.Host.call_json answers.
#pragma once

#include <machina/host.hpp>

#include <string>
#include <string_view>

namespace machina::ndjson {

struct Handled {
  bool has_id = false;   // the response carries the request's id (it may overtake others)
  bool overran = false;  // the response went through the overrun sink instead (nothing appended)
};

/// Decodes one request, handles it and appends the response line to `out`. `front`: the
/// calling front's label. `run_aid`: --run's aid from the command line (the body then may
/// name the same aid or none). `nul_terminated`: text[size] is readable and '\0' (decoding
/// goes faster).
Handled respond(Host& host, std::string_view text, CallerState& session, std::string& out, FrontLabel front,
                OverrunSink* overrun_sink = nullptr, std::string_view run_aid = {}, bool nul_terminated = false);

/// The response line to a request refused by size before it was read.
void respond_too_large(const Host& host, std::string& out);

}  // namespace machina::ndjson
