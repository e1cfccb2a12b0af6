// Error kinds and statuses: one definition (error_kinds.def) behind the wire `code`,
// the C++ exception and the Python exception classes.
#pragma once

#include <array>
#include <stdexcept>
#include <string>
#include <string_view>

namespace machina {

/// The dispatch contract's step statuses (docs/protocol.md).
enum class Status { OK, INVALID_PICK, TOOL_ERROR, BREAKER_TRIP };

std::string_view status_name(Status s) noexcept;

enum class ErrorKind {
  none,
#define MACHINA_ERROR_KIND(name, code, status, call, breaker, type) name,
#include <machina/error_kinds.def>
#undef MACHINA_ERROR_KIND
};

struct ErrorKindInfo {
  ErrorKind kind;
  std::string_view code;
  Status status;
  bool call_response;  // carries output_json and ds_state
  bool counts_for_breaker;
  std::string_view error_type;  // "AccessDenied", "NotFound", "InvalidInput", "Timeout" or "SystemError"
};

/// Every kind but `none`, in declaration order.
const std::array<ErrorKindInfo,
#define MACHINA_ERROR_KIND(name, code, status, call, breaker, type) +1
                 0
#include <machina/error_kinds.def>
#undef MACHINA_ERROR_KIND
                 >&
all_error_kinds() noexcept;

const ErrorKindInfo& error_info(ErrorKind kind) noexcept;

/// Raised by host set-up (loading plugins, bad options): never by a request, which
/// always gets a response instead.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace machina
