// The security policy of the built-in tool packs (docs/tool-packs.md): where the file
// tools may go and what they must never touch, which commands shell.exec may run and in
// what walls, how Python code runs and what may be installed for it, how often each tool
// may be called, and what each user sees. Read from a TOML file (--policy, or
// $MACHINA_TOOLHOST_POLICY); without one, safe defaults: files only under the workspace, no
// command at all, no network for anything a caller runs.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace machina {

/// Names no file tool may open, matched against every part of a path (a pattern without
/// a '/') or the path beneath its root (a pattern with one); fnmatch(3) globs, matched
/// whatever the case of the name.
const std::vector<std::string>& default_deny_globs();

struct FilePolicy {
  std::vector<std::string> roots;  // absolute; the first is where relative paths go
  std::vector<std::string> deny = default_deny_globs();
  std::uint64_t max_read_bytes = 512 * 1024;    // a larger file is refused (a prefix may be asked for)
  std::uint64_t max_write_bytes = 1024 * 1024;  // content over this is refused before anything is written
  std::uint64_t max_list_entries = 10'000;      // a listing stops here (truncated: true)
  std::uint64_t max_list_depth = 32;            // how deep a recursive listing goes
};

struct ShellPolicy {
  std::vector<std::string> allow;  // command names, or absolute paths; empty: no command runs
  std::vector<std::string> deny = {"sudo",     "su",     "doas",  "pkexec",   "rm",      "dd",      "mkfs",
                                   "shutdown", "reboot", "halt",  "poweroff", "kill",    "killall", "pkill",
                                   "chmod",    "chown",  "mount", "umount",   "nsenter", "unshare", "chroot"};
  std::int64_t timeout_ms = 60'000;            // the whole process group is killed after it
  std::uint64_t memory_mb = 512;               // resident memory of the command and its children
  std::uint64_t cpu_seconds = 60;              // RLIMIT_CPU
  std::uint64_t file_size_mb = 64;             // RLIMIT_FSIZE
  std::uint64_t open_files = 256;              // RLIMIT_NOFILE
  bool network = false;                        // false: a network namespace with nothing in it
  bool subprocesses = false;                   // false: the command may not start processes (seccomp)
  std::uint64_t max_output_bytes = 64 * 1024;  // of stdout and of stderr each; more is cut (truncated)
  std::vector<std::string> path = {"/usr/local/bin", "/usr/bin", "/bin"};  // where names are looked up
  // What a command may read besides the caller's roots (with Landlock; the roots' denied
  // names are hidden from it whatever this says).
  std::vector<std::string> read_paths = {"/usr",
                                         "/bin",
                                         "/sbin",
                                         "/lib",
                                         "/lib32",
                                         "/lib64",
                                         "/etc/ld.so.cache",
                                         "/etc/localtime",
                                         "/etc/passwd",
                                         "/etc/group",
                                         "/etc/nsswitch.conf",
                                         "/etc/alternatives",
                                         "/etc/ssl"};
  std::uint64_t max_scanned_entries = 100'000;  // names looked at to find the roots' denied ones
};

struct CodePolicy {
  std::string rg;                           // ripgrep ("": found beside the host, or on PATH)
  std::uint64_t max_results = 200;          // matches a grep returns at most (truncated: true)
  std::uint64_t max_file_bytes = 10 << 20;  // larger files are not searched (nor indexed)
  // code.search: its indexes live in `index_dir`, never beneath a root any tool can reach
  // (a policy file that puts it there is refused; a default that falls there leaves
  // `index_dir_conflict` saying so, and code.search refuses to run).
  std::string index_dir;                       // absolute (default: default_index_dir())
  std::string index_dir_conflict;              // why code.search may not use the default index_dir
  std::uint64_t max_index_files = 20'000;      // files looked at and indexed per root (the first by path)
  std::uint64_t max_index_bytes = 256 << 20;   // bytes of files indexed per root
  std::uint64_t max_refresh_bytes = 64 << 20;  // bytes read by one refresh; the rest waits for the next
  std::vector<std::string> default_codebases;  // what a caller without a [users] entry may search
};

/// execute_python and its installs (docs/tool-packs.md#execute_python).
struct PythonPolicy {
  std::string python = "python3";  // the interpreter: a name looked up on PATH, or an absolute path
  std::string workspaces;          // where workspaces live ("": $XDG_STATE_HOME/machina-toolhost/python)
  // What one call's code may use.
  std::int64_t timeout_ms = 30'000;      // wall clock; its interpreter is killed after it
  std::uint64_t cpu_seconds = 30;        // CPU time of one call (TimeoutError in the code past it)
  std::uint64_t memory_mb = 512;         // the interpreter's address space (MemoryError past it)
  std::uint64_t file_size_mb = 64;       // RLIMIT_FSIZE
  std::uint64_t folder_quota_mb = 1024;  // what a call's or session's folder may hold (its code is killed past it)
  std::uint64_t open_files = 256;        // RLIMIT_NOFILE
  std::uint64_t max_code_bytes = 256 * 1024;
  std::uint64_t max_output_bytes = 64 * 1024;  // of stdout and of stderr each; more is cut (truncated)
  std::uint64_t max_result_bytes = 64 * 1024;  // the result's JSON; a larger one is a cut repr
  // Warm interpreters and sessions.
  std::uint64_t workers = 2;               // warm interpreters for calls without a session, per workspace
  std::uint64_t max_sessions = 8;          // live sessions in all; a new one ends the idlest idle one
  std::int64_t session_idle_ms = 600'000;  // a session unused this long is ended
  // What the code may read besides the interpreter's own files, its workspace's packages
  // and its own folder (with Landlock; the lease key is hidden whatever this says).
  std::vector<std::string> read_paths = {
      "/lib",           "/lib64",           "/usr/lib",           "/usr/lib64",
      "/usr/local/lib", "/etc/ld.so.cache", "/etc/localtime",     "/usr/share/zoneinfo",
      "/etc/passwd",    "/etc/group",       "/etc/nsswitch.conf", "/etc/mime.types"};
  // Installs: pip, one package at a time, into the workspace's environment.
  std::vector<std::string> allow = {"*"};     // package names (fnmatch globs) that may be installed; empty: none
  std::vector<std::string> deny;              // names never installed; deny wins over allow
  std::string index_url;                      // pip's --index-url ("": pip's own default)
  std::vector<std::string> find_links;        // pip's --find-links: folders (absolute) or http(s) URLs
  bool no_index = false;                      // pip's --no-index
  bool allow_urls = false;                    // a requirement may be an https URL ("name @ https://...")
  bool only_binary = true;                    // wheels only: no package's code runs while it installs
  std::int64_t install_timeout_ms = 300'000;  // one pip run
  std::uint64_t max_install_packages = 16;    // install_packages in one execute_python call
  // sync_workspace: the caller's first root copied for the code, up to these.
  std::uint64_t sync_max_files = 10'000;
  std::uint64_t sync_max_bytes = 64ULL << 20;
};

/// At most `calls` calls in any `per_seconds` (a token bucket: `calls` at once, refilled
/// evenly).
struct RateLimit {
  double calls = 0;
  double per_seconds = 1;
};

/// What one user (a request's `user`) may reach instead of the defaults.
struct UserScope {
  std::vector<std::string> roots;      // empty: the [files] roots
  std::vector<std::string> codebases;  // codebase ids this user may search
};

struct Policy {
  std::string source = "built-in defaults";  // the file it was read from
  FilePolicy files;
  ShellPolicy shell;
  CodePolicy code;
  PythonPolicy python;
  std::map<std::string, RateLimit> rate_limits;  // by tool name (aid or service name)
  std::map<std::string, UserScope> users;
  std::map<std::string, std::string> codebases;  // id -> root directory
  bool unknown_users = true;                     // a user not listed gets the defaults (false: refused)
  /// Files no tool may read or list whatever the roots (the lease key), by device and inode.
  std::vector<std::pair<dev_t, ino_t>> protected_files;

  /// The roots a user's calls may use (the user's own, or the [files] roots); empty with
  /// `why` when the user may use none.
  const std::vector<std::string>* roots_for(std::string_view user, std::string& why) const;
  /// The codebase ids a user may search (a listed user's own `codebases`, else
  /// [code] default_codebases); null with `why` when the user may use none.
  const std::vector<std::string>* codebases_for(std::string_view user, std::string& why) const;
  bool is_protected(dev_t dev, ino_t ino) const;
  /// The scope a user's calls belong to: the user's own name when [users] lists it, else
  /// "" (the defaults' scope, shared by every user not listed).
  std::string scope_of(std::string_view user) const;
};

/// Where code.search keeps its indexes by default: $XDG_CACHE_HOME/machina-toolhost/code-index,
/// else ~/.cache/machina-toolhost/code-index, else /tmp/machina-toolhost-UID/code-index.
std::string default_index_dir();

/// The first root (of [files], of a user, of a codebase) that `dir` lies in or holds, or "".
std::string root_overlapping(const Policy& policy, const std::string& dir);

/// The defaults: files under `workspace` (made absolute; "" for the working directory).
Policy default_policy(const std::string& workspace);

/// Reads a policy file. Throws ConfigError ("FILE:LINE: what") for a file that cannot be
/// read, is not TOML, or has an unknown or mistyped key, a root that is not a directory,
/// a rate limit that is not one.
Policy load_policy(const std::string& path, const std::string& workspace);
Policy parse_policy(std::string_view text, const std::string& path, const std::string& workspace);

/// The policy a host starts with: the file $MACHINA_TOOLHOST_POLICY names, else the
/// defaults over $MACHINA_TOOLHOST_WORKSPACE (or the working directory). The lease key
/// file ($MACHINA_LEASE_KEY_FILE) is protected either way.
Policy policy_from_env();

}  // namespace machina
