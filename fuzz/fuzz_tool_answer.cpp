// Fuzz target: the decoder of tool protocol v1 answers (what a Python tool worker or an HTTP
// tool service sends back, neither of them trusted). Never crashes; what it accepts has its
// result and trace slices inside the input, and a result always.
#include <machina/tool_protocol.hpp>

#include <cstdint>
#include <cstdlib>
#include <string>

namespace {
bool inside(std::string_view part, const std::string& text) {
  return part.empty() || (part.data() >= text.data() && part.data() + part.size() <= text.data() + text.size());
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  machina::tool_protocol::Answer answer;
  std::string why;
  if (machina::tool_protocol::decode_answer(text, answer, why)) {
    if (answer.ok && answer.result.empty()) std::abort();
    if (answer.result != "null" && !inside(answer.result, text)) std::abort();
    if (!inside(answer.trace, text)) std::abort();
    if (!answer.ok && answer.error_type.empty()) std::abort();
  } else if (why.empty()) {
    std::abort();
  }
  return 0;
}
