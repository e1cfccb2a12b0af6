// Tables behind errors.hpp.
#include <machina/errors.hpp>

namespace machina {

std::string_view status_name(Status s) noexcept {
  switch (s) {
    case Status::OK: return "OK";
    case Status::INVALID_PICK: return "INVALID_PICK";
    case Status::TOOL_ERROR: return "TOOL_ERROR";
    case Status::BREAKER_TRIP: return "BREAKER_TRIP";
  }
  return "";
}

namespace {
using KindTable = std::remove_cvref_t<decltype(all_error_kinds())>;
constexpr KindTable kKinds{{
#define MACHINA_ERROR_KIND(name, code, status, call, breaker, type) \
  ErrorKindInfo{ErrorKind::name, code, Status::status, call, breaker, type},
#include <machina/error_kinds.def>
#undef MACHINA_ERROR_KIND
}};
constexpr ErrorKindInfo kNone{ErrorKind::none, "", Status::OK, true, false, ""};
}  // namespace

const KindTable& all_error_kinds() noexcept {
  return kKinds;
}

const ErrorKindInfo& error_info(ErrorKind kind) noexcept {
  if (kind == ErrorKind::none) return kNone;
  return kKinds[static_cast<std::size_t>(kind) - 1];
}

}  // namespace machina
