// One call of a pack tool through PackRunner, as the host makes it: the tool's registered
// name, its input, a deadline; what the runner answered and the output it set.
#pragma once

#include <machina/call_context.hpp>
#include <machina/clock.hpp>
#include <machina/policy.hpp>
#include <machina/runners/pack_runner.hpp>
#include <machina/tool.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "temp_dir.hpp"

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

namespace machina::test {

/// The packs' workspace: `ws` in a fresh temporary folder, and the default policy rooted there.
struct PackWorkspace {
  TempDir tmp;
  std::filesystem::path ws;
  Policy policy;
  PackWorkspace() : ws(tmp.path / "ws") {
    std::filesystem::create_directories(ws);
    policy = default_policy(ws.string());
  }
  /// Writes `text` to the file `rel` beneath the workspace, making its folders.
  void put(const std::string& rel, const std::string& text) const {
    std::filesystem::create_directories((ws / rel).parent_path());
    std::ofstream(ws / rel, std::ios::binary) << text;
  }
};

struct PackAnswer {
  RunOutcome outcome;
  nlohmann::json output;  // null unless the tool ran
  bool ok() const { return outcome.ending == RunOutcome::Ending::ran; }
};

/// Calls the tool registered as `name` (an aid, a NATS subject or a function name).
inline PackAnswer call_pack(PackRunner& runner, const std::string& name, const nlohmann::json& input,
                            const std::string& user = "", std::int64_t timeout_ms = 30'000) {
  struct NoOverrun final : Overrun {
    void overrun() noexcept override {}
  } no_overrun;
  Tool tool{CircuitBreaker::Options{}};
  tool.info.aid = name;
  const std::string input_json = input.dump();
  CallContext ctx(8 << 20, std::make_shared<const Slots>());
  const RunSpec spec{tool,    input_json, steady_now_ms() + timeout_ms, timeout_ms, ctx, &no_overrun, {}, nullptr,
                     nullptr, user};
  PackAnswer answer;
  answer.outcome = runner.run(spec);
  if (answer.ok() && ctx.output_set) answer.output = nlohmann::json::parse(ctx.output);
  return answer;
}

/// The call was refused with `kind`, its detail naming `detail_part`.
inline void check_refused(const PackAnswer& a, ErrorKind kind, const std::string& detail_part) {
  CHECK(a.outcome.ending == RunOutcome::Ending::failed);
  CHECK(a.outcome.failure == kind);
  CHECK_MESSAGE(a.outcome.detail.find(detail_part) != std::string::npos, a.outcome.detail);
}

}  // namespace machina::test
