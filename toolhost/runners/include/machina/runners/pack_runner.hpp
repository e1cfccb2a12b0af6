// The built-in tool packs (docs/tool-packs.md): file tools, shell.exec, code.grep and
// code.search, execute_python with its installs, run in the host by the pack runner, each
// call checked against the security policy (policy.hpp) first. Every tool is reachable
// under its aid (AID.FILE.READ.v1 ...), which answers in detail, and under the file/shell
// service's names (the NATS subject `tools.file.read` and the function name `readFile`),
// which answer in that service's shapes. A refusal is a structured error whose text starts
// with the service's error type ("AccessDenied: ...", "NotFound: ...", "InvalidInput: ...",
// "SystemError: ...") and whose `code` is the host's (access_denied, not_found, invalid_input,
// system_error, rate_limited; a command or a search past its time: timeout).
#pragma once

#include <machina/policy.hpp>
#include <machina/runner.hpp>
#include <machina/tool.hpp>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace machina {

class Spawner;
namespace packs {
class PythonPack;
}

class PackRunner final : public Runner {
 public:
  /// `executable`: machina-toolhost, the launcher of shell.exec's walls ("" when not known:
  /// shell.exec then refuses what needs walls).
  PackRunner(Policy policy, std::string executable);
  ~PackRunner() override;

  /// The packs' tools (`packs`: "files", "shell", "code", "python"; empty: all), every name of each.
  std::vector<ToolInfo> tools(const std::vector<std::string>& packs) const;
  /// The pack names there are.
  static const std::vector<std::string>& pack_names();

  RunOutcome run(const RunSpec& spec) override;
  /// Ends execute_python's workers and sessions; later calls of it end `closed`.
  void close() override;
  std::string_view kind() const override { return "pack"; }

  const Policy& policy() const { return policy_; }

 private:
  /// Whether a call of `tool` (a name of the pack tool `primary`) by `user` is within its
  /// rate limit (and counts it).
  bool admit(const std::string& tool, const std::string& primary, std::string_view user, std::string& why);

  Policy policy_;
  std::string executable_;
  std::unique_ptr<Spawner> spawner_;  // shell.exec's commands die with the host, not with a passing thread
  std::unique_ptr<packs::PythonPack> python_;
  struct Bucket {
    double tokens = 0;
    std::chrono::steady_clock::time_point last;
  };
  std::mutex rate_mu_;
  std::map<std::pair<std::string, std::string>, Bucket> buckets_;  // (tool, user); bounded below
};

}  // namespace machina
