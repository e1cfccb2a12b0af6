// What a running tool sees through the C ABI: the host services (output, error, ds_state
// slots) behind machina_host_api, collected into one CallContext per call. Shared by
// calls that run in the host's own threads and calls that run in a worker process.
#pragma once

#include <machina/plugin_abi.h>
#include <machina/ds_state.hpp>

#include <memory>
#include <string>
#include <string_view>

namespace machina {

struct CallContext {
  CallContext(std::size_t max_output_bytes, const CallerState* session)
      : max_output(max_output_bytes), session_(session) {}
  CallContext(std::size_t max_output_bytes, std::shared_ptr<const Slots> state)
      : max_output(max_output_bytes), base(std::move(state)) {}

  std::size_t max_output;
  std::string output;
  bool output_set = false;
  bool output_overflow = false;
  std::string error;
  std::shared_ptr<const Slots> base;     // the state the tool reads: taken on first read
  std::unique_ptr<SlotChanges> changes;  // what the tool wrote: made on first write
  std::string trace_json;                // the runner's trace of the call (a JSON object), if any

  /// The tool's output, unless it is over max_output (then output_overflow, and false).
  bool set_output(std::string_view json) {
    if (json.size() > max_output) {
      output_overflow = true;
      return false;
    }
    output.assign(json);
    output_set = true;
    return true;
  }
  bool set_output(std::string&& json) {
    if (json.size() > max_output) {
      output_overflow = true;
      return false;
    }
    output = std::move(json);
    output_set = true;
    return true;
  }

  const Slots& state();
  SlotChanges& writes();
  machina_call* as_call() { return reinterpret_cast<machina_call*>(this); }

 private:
  const CallerState* session_ = nullptr;
};

/// The services table handed to every tool call.
const machina_host_api& host_api() noexcept;

/// Longest error message kept from a tool (the rest is cut).
inline constexpr std::size_t kMaxToolErrorBytes = 64 * 1024;

}  // namespace machina
