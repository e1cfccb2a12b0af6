// Inside the pack runner (runners/pack_runner.hpp): one call of a pack tool as its
// handler sees it, what a handler answers, and the table of the packs' tools.
#pragma once

#include <machina/errors.hpp>
#include <machina/policy.hpp>
#include <machina/runner.hpp>

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace machina {
class Spawner;
class ChildProcess;
struct ChildSpec;
}  // namespace machina

namespace machina::packs {

class PythonPack;

/// Which answer a name of a tool gives: detailed (its aid: an object with every detail) or
/// service (its service names, tools.file.read and readFile: `data` in the file/shell
/// service's own shapes, docs/tool-packs.md).
enum class Shape { detailed, service };

struct Call {
  const nlohmann::json& input;  // an object (the schema said so)
  const Policy& policy;
  std::string_view user;  // the request's `user` ("" when none)
  const RunSpec& spec;
  Shape shape;
  const std::string& executable;  // machina-toolhost (shell.exec's launcher); "" if unknown
  Spawner* spawner;
  PythonPack* python;  // execute_python's workspaces and sessions (python_pack.hpp)
};

/// A handler's answer: output, or a refusal whose text starts with the service's error type.
struct Result {
  ErrorKind kind = ErrorKind::none;
  std::string error;
  nlohmann::json output;
  RunOutcome::Ending ending = RunOutcome::Ending::ran;  // timed_out, cancelled: no output

  static Result ok(nlohmann::json out) {
    Result r;
    r.output = std::move(out);
    return r;
  }
  /// A call that did not run to its end: cancelled, or timed out (`why` says how).
  static Result stopped(RunOutcome::Ending ending, std::string why = {}) {
    Result r;
    r.ending = ending;
    r.error = std::move(why);
    return r;
  }
  static Result fail(ErrorKind kind, std::string error) {
    Result r;
    r.kind = kind;
    r.error = std::move(error);
    return r;
  }
};

inline Result denied(const std::string& why) {
  return Result::fail(ErrorKind::access_denied, "AccessDenied: " + why);
}
inline Result missing(const std::string& why) {
  return Result::fail(ErrorKind::target_not_found, "NotFound: " + why);
}
inline Result invalid(const std::string& why) {
  return Result::fail(ErrorKind::invalid_input, "InvalidInput: " + why);
}
inline Result system_error(const std::string& why) {
  return Result::fail(ErrorKind::system_error, "SystemError: " + why);
}

using Handler = Result (*)(const Call&);

/// One tool of a pack, with its three names.
struct Entry {
  const char* pack;      // "files", "shell", "code", "python"
  const char* aid;       // AID.FILE.READ.v1
  const char* subject;   // tools.file.read (the file/shell service's NATS subject)
  const char* function;  // readFile (the function name an LLM calls)
  const char* name;      // file_read (for listings)
  Handler handler;
  const char* description;
  const char* schema;          // the aid's (detailed answers)
  const char* service_schema;  // the service names'
  int tier;
  std::vector<std::string> side_effects;
  bool read_only;
};

const std::vector<Entry>& entries();

/// A path as it may be quoted back in an error: at most 200 characters of it.
std::string excerpt(std::string_view path);

/// Where a caller's path leads: a root and the parts beneath it.
struct Target {
  const std::string* root = nullptr;
  std::vector<std::string> parts;
};

/// The caller's path resolved as text (roots, `..`, NUL, deny globs), or the refusal.
/// `root_ok`: the path may name a root itself (a listing, a working directory).
bool resolve_path(const Call& c, const std::string& path, bool root_ok, Target& t, Result& refusal);

/// A failure to open or change a path, by its reason: missing → NotFound; a link, a
/// FIFO, a device, a hard link, no permission → AccessDenied; anything else SystemError.
Result open_failed(const std::string& path, const std::string& why);

/// Whether a path beneath its root matches a deny glob.
bool denied_by_name(const Policy& policy, const std::vector<std::string>& parts);

/// ripgrep: the policy's, else beside `executable` or this program (or in a bin/ above
/// them), else on PATH; "" when there is none.
std::string find_rg(const Policy& policy, const std::string& executable);
/// The answer of a code tool that found no ripgrep (find_rg said "").
Result ripgrep_missing();

/// The descriptor ripgrep started by rg_child has the searched folder or file open on, and
/// the path it sees it by (a match's path: below kRgSearchedPath + "/", or that path itself).
inline constexpr int kRgSearchedFd = 3;
inline constexpr std::string_view kRgSearchedPath = "/proc/self/fd/3";
inline constexpr std::string_view kRgSearchedPrefix = "/proc/self/fd/3/";

/// ripgrep `rg` run on the folder or file open at `fd` (seen as kRgSearchedPath), with
/// what every use shares: no config file, no symlink followed, no git repository needed,
/// paths in order (one thread: the same answer every time), files over the policy's size
/// skipped, the policy's denied names left out, a fixed PATH. `args` (the mode and its own
/// options) come first.
ChildSpec rg_child(const std::string& rg, const Policy& policy, std::vector<std::string> args, int fd);

/// Starts ripgrep as `child` says, its input closed and its stderr drained; null with
/// `failed` set (a SystemError) if it cannot start.
std::unique_ptr<ChildProcess> start_rg(const ChildSpec& child, Spawner* spawner, Result& failed);

/// The names in the open folder `dir` (without . and ..), read through a descriptor of its
/// own; false if it cannot be read.
bool names_in(int dir, std::vector<std::string>& names);

/// The paths beneath `root` that match the policy's deny globs (not looked into further),
/// looking at up to `cap` names; false past the cap.
bool denied_beneath(const Policy& policy, const std::string& root, std::uint64_t cap, std::vector<std::string>& found);

Result file_read(const Call& c);
Result file_write(const Call& c);
Result file_delete(const Call& c);
Result file_list(const Call& c);
Result shell_exec(const Call& c);
Result code_grep(const Call& c);
Result code_search(const Call& c);
Result python_execute(const Call& c);
Result python_install(const Call& c);
Result python_list(const Call& c);

}  // namespace machina::packs
