// Starting a program confined by the operating system (`machina-toolhost --sandbox-exec SPEC
// -- PROGRAM ARGS...`): how Python tool workers get their capability guarantees. Three
// processes, each with one job:
//  - the launcher (started by the host) builds the walls (sandbox.hpp: user, PID, mount,
//    IPC and optionally network namespaces) and waits for the init, ending as it ends;
//  - the init (PID 1 of the new namespace) mounts a /proc of its own, starts the program,
//    reaps, watches its memory and what its writable paths hold, and when the program
//    ends, ends (and with it everything left in the namespace);
//  - the program drops every capability, is restricted by Landlock (what it may read,
//    write and execute) and seccomp (no new process, no socket), then is executed.
// Every restriction is the kernel's: nothing depends on the program's cooperation.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace machina::sandbox {

struct ExecSpec {
  bool own_network = false;     // a network namespace with no interface up
  bool no_sockets = false;      // seccomp: socket(2) refused (socketpair still works)
  bool no_processes = false;    // seccomp: fork, vfork, clone without CLONE_THREAD, clone3 refused
  bool restrict_read = false;   // Landlock: reading only beneath read_paths and write_paths
  bool restrict_write = false;  // Landlock: writing only beneath write_paths; every other mount read-only
  bool restrict_exec = false;   // Landlock: executing only exec_paths
  std::vector<std::string> read_paths;
  std::vector<std::string> write_paths;
  std::vector<std::string> exec_paths;
  // Mounted without exec, but exec_paths: nothing beneath them runs, not even through the
  // dynamic loader (which maps a program rather than executing it, out of Landlock's sight).
  std::vector<std::string> no_exec_paths;
  std::vector<std::string>
      hidden_files;             // files covered by /dev/null (the lease key file), directories by an empty one
  std::uint64_t memory_mb = 0;  // the init kills the program resident past this; 0: no cap
  // The init kills the program when write_paths hold more than this (allocated blocks,
  // measured with the memory); no file may grow past it either (RLIMIT_FSIZE). 0: no cap.
  std::uint64_t write_quota_mb = 0;
  // Resource limits set on the program before it is executed (0: none).
  std::uint64_t address_space_mb = 0;  // RLIMIT_AS
  std::uint64_t open_files = 0;        // RLIMIT_NOFILE
  std::uint64_t file_size_mb = 0;      // RLIMIT_FSIZE
  std::uint64_t cpu_seconds = 0;       // RLIMIT_CPU

  std::string to_json() const;
  /// Throws ConfigError for a spec that is not one.
  static ExecSpec from_json(std::string_view text);
};

/// The exit status of a launcher whose program the init killed for its memory (its stderr
/// says so too).
inline constexpr int kMemoryCapStatus = 125;
/// The exit status of a launcher whose program the init killed for what its writable paths
/// hold (its stderr says so too).
inline constexpr int kWriteQuotaStatus = 124;

/// What this machine offers, probed once.
struct Support {
  bool namespaces = false;     // unprivileged user namespaces, with PID, mount, IPC and network ones
  std::string namespaces_why;  // why not
  int landlock_abi = 0;        // 0: no Landlock (or MACHINA_TOOLHOST_NO_LANDLOCK=1)
};
const Support& support();

/// The launcher: builds the walls, runs the program confined (argv[0] is its path) and
/// returns its exit status (or 128 + the signal that ended it). On a failure to confine it,
/// says why on stderr and returns 126; the program then never runs.
int exec_in_sandbox(const ExecSpec& spec, char** argv);

/// A process's resident memory in MiB (from /proc/PID/statm); 0 when it cannot be read.
std::uint64_t resident_mb(pid_t pid);

/// The ELF interpreter (dynamic loader) a program names, resolved; "" for none.
std::string elf_interpreter(const std::string& program);

}  // namespace machina::sandbox
