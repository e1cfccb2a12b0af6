// The container runner: a Python tool (tool protocol v1) run inside a container image, one
// container per call, through the podman or docker command. The call object goes to the
// container's stdin, its answer ({ok, result} or {ok: false, error}) comes back on stdout.
// The tool's required guarantees are enforced by the container's own flags (no network,
// a read-only root, one process, a memory limit; no host folder enters, nor a host variable
// but the secrets it is given),
// and every container runs without capabilities or privilege gain. A container still
// running at the call's deadline, over the answer cap, or whose runtime client ended without
// an answer, is killed and removed by its name; so are those under way when the runner closes.
#pragma once

#include <machina/runner.hpp>
#include <machina/runners/protocol_trace.hpp>

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace machina {

struct ContainerToolFields {
  std::string runtime;                                   // the runtime's program (an absolute path)
  std::string runtime_name;                              // "podman" or "docker"
  std::string image;                                     // run as named (the runtime pulls or finds it)
  std::vector<std::string> command;                      // what runs in the container
  std::string name;                                      // the protocol's `tool`
  std::string entry;                                     // module:function
  std::vector<std::pair<std::string, std::string>> env;  // set in the container
  std::vector<std::string> pass_env;                     // the host's variables it gets (a pack's secrets)
  std::map<std::string, bool> guarantees;                // required by the tool
  std::uint64_t memory_mb = 0;                           // the container's memory limit (0: none)
  std::size_t max_answer_bytes = 0;                      // the most of its stdout read
  ToolSource source;
};

/// What runs in a container whose tool names no command: the protocol's runner module
/// (`python -m namel3ss_tools.runner`), which reads the call on stdin.
const std::vector<std::string>& default_container_command();

/// Why `image` cannot be an image reference on the runtime's command line ("" when it can):
/// one that starts with '-' would be read as a flag (and could undo the guarantees' flags),
/// one naming a local transport (oci-archive:, dir:, ...) would have the runtime read a host
/// path, and white space or control characters are in no image's name.
std::string container_image_problem(const std::string& image);

/// Why `name` cannot be a variable set in a container ("" when it can): only
/// [A-Za-z_][A-Za-z0-9_]* is taken (a runtime copies a name given without a value, or a
/// pattern, from its own environment: the host's).
std::string container_variable_problem(const std::string& name);

/// The arguments after the runtime's program that start one call's container named `name`,
/// and the guarantees those flags enforce (name -> how). With podman the container is also
/// killed by its own monitor `timeout_s` seconds after it starts (0: no such limit), should
/// the host be gone by then.
struct ContainerInvocation {
  std::vector<std::string> argv;  // argv[0] is the runtime
  std::map<std::string, std::string> enforced;
};
ContainerInvocation container_invocation(const ContainerToolFields& fields, const std::string& name,
                                         std::int64_t timeout_s = 0);

class ContainerRunner final : public Runner {
 public:
  explicit ContainerRunner(ContainerToolFields fields);

  RunOutcome run(const RunSpec& spec) override;
  /// Later calls end `closed`; the containers of calls still running are killed and removed
  /// (those calls end as their runtime's client sees it).
  void close() override;
  std::string_view kind() const override { return "container"; }
  std::vector<std::string> enforced_guarantees() const override;

  const ContainerToolFields& fields() const { return fields_; }

 private:
  /// Kills and removes a container that outlived its call.
  void remove_container(const std::string& name) const;

  ContainerToolFields fields_;
  std::mutex mu_;
  bool closed_ = false;            // guarded by mu_
  std::set<std::string> running_;  // the containers of calls under way (guarded by mu_)
};

}  // namespace machina
