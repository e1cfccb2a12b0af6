// A tools/call between the JSON-RPC fronts (--mcp, --skill) and the host: its params read
// into a Request (the tool's name, its arguments, and in `_meta` the progress token and the
// call options under "machina/"), and a Response written as the call's result (content,
// structuredContent, isError, and in `_meta` the host's status and code, the ds_state
// delta, the trace) or, for an error of the request itself, as a JSON-RPC error.
#pragma once

#include <machina/jsonrpc.hpp>
#include <machina/request.hpp>

#include <string>
#include <string_view>

namespace machina::cli {

/// Fills `request` from a tools/call's params, and `token` with its progress token (raw
/// JSON) if it has one. False with `why` and the kind of error when the params are not
/// what a call needs.
bool read_call_params(const jsonrpc::Message& message, Request& request, std::string& token, std::string& why,
                      ErrorKind& kind);

/// Whether a host error is one of the request rather than of a call: a JSON-RPC error, not
/// a result.
bool is_request_error(ErrorKind kind);

/// error.data of a JSON-RPC error that stands for a host response: its status and code.
std::string error_data(ErrorKind kind);

/// How a result is written: MCP's (content blocks), MCP's on a 2026-07-28 connection
/// (stamped with the result type and the server), or a skill's (content as a string).
enum class ResultForm { mcp, mcp_stamped, skill };

/// The answer to the call `id` (raw JSON) for the host's response `r`, one line.
void append_call_result(const Response& r, std::string_view id, ResultForm form, std::string& out);

/// The `_meta` member naming this server, which every 2026-07-28 result carries.
std::string_view server_info_stamp();

}  // namespace machina::cli
