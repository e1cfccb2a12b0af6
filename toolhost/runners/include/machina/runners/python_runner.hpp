// The Python runner: tools that are `module:function` entries (tool protocol v1), each call
// sent to the warm workers of its interpreter (python_worker_pool.hpp) and answered from
// what the worker reports, with the call's trace (runner, source, interpreter, enforcement).
// A tool whose guarantees cannot be enforced here has every call refused guarantee_blocked.
#pragma once

#include <machina/runner.hpp>
#include <machina/runners/protocol_trace.hpp>
#include <machina/runners/python_worker_pool.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace machina {

/// One Python tool: its entry, the fields of its calls, and the pool that runs them.
class PythonRunner final : public Runner {
 public:
  struct ToolFields {
    std::string name;   // the protocol's `tool`
    std::string entry;  // module:function
    bool sandbox = false;
    std::string capability_context_json;  // sent with each call ("" for none)
    std::string enforcement_json;         // for the trace: what enforces each guarantee ("" for none)
    std::string refusal;                  // set: every call is refused guarantee_blocked with this
    ToolSource source;
  };
  PythonRunner(std::shared_ptr<PythonWorkerPool> pool, ToolFields fields);

  RunOutcome run(const RunSpec& spec) override;
  void close() override { pool_->close(); }
  std::string_view kind() const override { return "python"; }
  std::vector<std::string> enforced_guarantees() const override;

  const ToolFields& fields() const { return fields_; }

 private:
  std::shared_ptr<PythonWorkerPool> pool_;
  ToolFields fields_;
};

}  // namespace machina
