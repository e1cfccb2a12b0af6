// The walls around isolated tool code (--isolation process), built from Linux namespaces
// and credentials so that no tool can reach the host: a user namespace (no capability in
// the host's), a PID namespace (the host and its other processes cannot be named, signalled
// or traced), a mount namespace with a /proc of its own and the lease key file hidden, an
// IPC namespace, and with no_network a network namespace. Each call then runs in a process
// of its own that is the init of a PID namespace of its own, so everything a call starts
// dies with it. See docs/operations.md ("Threat model").
#pragma once

#include <string>
#include <vector>

namespace machina::sandbox {

struct Walls {
  bool own_network = false;               // a network namespace with no interface up
  std::vector<std::string> hidden_files;  // covered by /dev/null (e.g. the lease key file)
  // Every mount read-only but the writable paths (each bound onto itself and left writable):
  // metadata (mode, times, owner, extended attributes) cannot be changed anywhere else,
  // which Landlock does not govern.
  bool read_only = false;
  std::vector<std::string> writable;
  // Mounted without exec (each bound onto itself), but the executable files (each bound
  // onto itself with exec): the dynamic loader cannot map another program from there.
  std::vector<std::string> no_exec;
  std::vector<std::string> executable;
};

/// Step 1, in the process the host started: a new user namespace in which this process's
/// user is itself (no capability outside), then new mount, PID and IPC (and network)
/// namespaces; mounts stop propagating back; hidden files are covered; with `read_only`,
/// every mount but the writable paths is made read-only; the no_exec paths lose exec. The
/// next child this
/// process forks is the init of the new PID namespace. Throws ConfigError naming the step.
void enter(const Walls& walls);

/// Step 2, in that child (PID 1 of the new namespace): a /proc that shows only the
/// sandbox's processes, then a second user and mount namespace, which locks every mount
/// made so far (code that runs later, even with capabilities in the sandbox, cannot undo
/// them, nor make a read-only one writable). The /proc stays writable for the mapping of
/// the inner user namespace (what may be written there is Landlock's to say). Throws
/// ConfigError naming the step.
void seal();

/// Step 3, in the template before any plugin code runs: no capability can ever be gained
/// again (securebits locked, bounding set emptied, no_new_privs), and of those it has (in
/// the sandbox's own namespace only) it keeps CAP_SYS_ADMIN alone, to give each call a PID
/// namespace of its own. Throws ConfigError if the kernel refuses.
void restrict_template();

/// Step 4, in a call process: not even that capability is left.
void drop_last_capability();

/// Threads of this process (from /proc/self/status); -1 if unknown.
int thread_count();

}  // namespace machina::sandbox
