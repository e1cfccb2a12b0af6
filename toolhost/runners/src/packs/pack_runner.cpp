// See runners/pack_runner.hpp.
#include <machina/runners/pack_runner.hpp>

#include "packs.hpp"
#include "python_pack.hpp"

#include <machina/child_process.hpp>
#include <machina/isolation/sandbox_exec.hpp>

#include <algorithm>

namespace machina {
namespace packs {
namespace {

constexpr const char* kPathSchema =
    R"({"type":"object","properties":{"path":{"type":"string","minLength":1}},"required":["path"]})";

}  // namespace

const std::vector<Entry>& entries() {
  static const std::vector<Entry> list = {
      {"files",
       "AID.FILE.READ.v1",
       "tools.file.read",
       "readFile",
       "file_read",
       file_read,
       "Reads a UTF-8 text file beneath the policy's roots (ours: up to max_bytes, default 65536, with "
       "`truncated`; its service names: the whole file, refused past the read limit). Never follows a symbolic "
       "link; reads only regular files with a single link; refuses denied names (.env, *.pem, id_* ...).",
       R"({"type":"object","properties":{"path":{"type":"string","minLength":1},)"
       R"("max_bytes":{"type":"integer","minimum":0,"maximum":1000000}},)"
       R"("required":["path"],"additionalProperties":false})",
       kPathSchema,
       0,
       {},
       true},
      {"files",
       "AID.FILE.WRITE.v1",
       "tools.file.write",
       "writeFile",
       "file_write",
       file_write,
       "Writes (or appends) text to a file beneath the policy's roots, making the folders it needs. Never "
       "follows a symbolic link; writes only regular files with a single link; refuses denied names.",
       R"({"type":"object","properties":{"path":{"type":"string","minLength":1},)"
       R"("content":{"type":"string"},"append":{"type":"boolean"}},)"
       R"("required":["path","content"],"additionalProperties":false})",
       R"({"type":"object","properties":{"path":{"type":"string","minLength":1},"content":{"type":"string"}},)"
       R"("required":["path","content"]})",
       1,
       {"fs_write"},
       false},
      {"files",
       "AID.FILE.DELETE.v1",
       "tools.file.delete",
       "deleteFile",
       "file_delete",
       file_delete,
       "Deletes a file (or a symbolic link itself) beneath the policy's roots; never a directory.",
       R"({"type":"object","properties":{"path":{"type":"string","minLength":1}},)"
       R"("required":["path"],"additionalProperties":false})",
       kPathSchema,
       1,
       {"fs_write"},
       false},
      {"files",
       "AID.FILE.LIST.v1",
       "tools.file.list",
       "listFiles",
       "file_list",
       file_list,
       "Lists a directory beneath the policy's roots (recursive on request, names filtered by a glob pattern): "
       "each entry's path, size and type (file, directory, symlink, other). Links are listed, never followed; "
       "denied names are left out.",
       R"({"type":"object","properties":{"path":{"type":"string"},"recursive":{"type":"boolean"},)"
       R"("pattern":{"type":"string"}},"additionalProperties":false})",
       R"({"type":"object","properties":{"path":{"type":"string"},"recursive":{"type":"boolean"},)"
       R"("pattern":{"type":"string"}}})",
       0,
       {},
       true},
      {"shell",
       "AID.SHELL.EXEC.v1",
       "tools.shell.exec",
       "execCommand",
       "shell_exec",
       shell_exec,
       "Runs one program with its arguments (never through a shell) if the policy allows it: no network, no "
       "new processes, writes only beneath the policy's roots, CPU, memory and file-size limits, killed with "
       "its process group at its timeout (default 60 s). Returns stdout, stderr (capped; `truncated`) and "
       "exit_code.",
       R"({"type":"object","properties":{"command":{"type":"string","minLength":1},)"
       R"("args":{"type":"array","items":{"type":"string"}},"cwd":{"type":"string"}},)"
       R"("required":["command"],"additionalProperties":false})",
       R"({"type":"object","properties":{"command":{"type":"string","minLength":1},)"
       R"("args":{"type":"array","items":{"type":"string"}},"cwd":{"type":"string"}},"required":["command"]})",
       2,
       {"process"},
       false},
      {"code",
       "AID.CODE.GREP.v1",
       "tools.code.grep",
       "grepCode",
       "code_grep",
       code_grep,
       "Searches the files beneath the policy's roots (or `path` beneath them) for a regular expression "
       "(ripgrep's syntax), respecting .gitignore, skipping hidden and binary files and denied names, following "
       "no link: each match's path, line number and content (at most 500 characters), at most max_results "
       "(default 200; `truncated` says when more were found).",
       R"({"type":"object","properties":{"pattern":{"type":"string","minLength":1},"path":{"type":"string"},)"
       R"("ignore_case":{"type":"boolean"},"max_results":{"type":"integer","minimum":1,"maximum":10000}},)"
       R"("required":["pattern"],"additionalProperties":false})",
       R"({"type":"object","properties":{"pattern":{"type":"string","minLength":1},"path":{"type":"string"},)"
       R"("ignore_case":{"type":"boolean"}},"required":["pattern"]})",
       0,
       {},
       true},
      {"code",
       "AID.CODE.SEARCH.v1",
       "tools.code.search",
       "searchCode",
       "code_search",
       code_search,
       "Ranked search (SQLite FTS5, BM25) over the files beneath the policy's roots, or over a codebase the "
       "policy grants the caller (codebase_id), for plain words: identifiers are found whole and by their "
       "camelCase and snake_case parts. Each result is a path, the best line of the hit (a number and a snippet "
       "of at most 500 characters) and a similarity in (0, 1], best first, at most `limit` (default 10). The index "
       "is brought up to date first (new and changed files read, removed ones dropped); .gitignore is respected, "
       "hidden and binary files, denied names and links are left out.",
       R"({"type":"object","properties":{"query":{"type":"string"},"limit":{"type":"integer","minimum":1,"maximum":100},)"
       R"("codebase_id":{"type":"string","minLength":1,"maxLength":256}},"required":["query"],)"
       R"("additionalProperties":false})",
       R"({"type":"object","properties":{"query":{"type":"string"},"limit":{"type":["integer","null"]},)"
       R"("codebase_id":{"type":["string","null"]}},"required":["query"]})",
       0,
       {},
       true},
      {"python",
       "AID.PYTHON.EXECUTE.v1",
       "tools.python.execute",
       "execute_python",
       "python_execute",
       python_execute,
       "Runs Python code (CPython) in a sandbox: no network, no new processes, writing only its own folder, with "
       "time, CPU and memory limits. The value of the last expression is the result (like a REPL); stdout and "
       "stderr are returned too. A session_id keeps variables between calls. install_packages installs packages "
       "first (pip); sync_workspace copies the file tools' workspace into the code's folder first. On failure: "
       "success false, the error, its traceback and advice.",
       R"({"type":"object","properties":{"code":{"type":"string"},)"
       R"("install_packages":{"type":"array","items":{"type":"string","minLength":1}},)"
       R"("sync_workspace":{"type":"boolean"},"session_id":{"type":"string","minLength":1,"maxLength":128}},)"
       R"("required":["code"],"additionalProperties":false})",
       R"({"type":"object","properties":{"code":{"type":"string"},)"
       R"("install_packages":{"type":"array","items":{"type":"string"}},"sync_workspace":{"type":"boolean"},)"
       R"("session_id":{"type":"string"}},"required":["code"]})",
       2,
       {"process"},
       false},
      {"python",
       "AID.PYTHON.INSTALL.v1",
       "tools.python.install",
       "install_python_package",
       "python_install",
       python_install,
       "Installs a Python package (a name with optional extras and version, like 'numpy>=1.26') with pip into "
       "this workspace's environment, for execute_python; skips it when it is installed already. On failure: "
       "success false with pip's error.",
       R"({"type":"object","properties":{"package":{"type":"string","minLength":1}},"required":["package"],)"
       R"("additionalProperties":false})",
       R"({"type":"object","properties":{"package":{"type":"string"}},"required":["package"]})",
       2,
       {"network", "fs_write"},
       false},
      {"python",
       "AID.PYTHON.LIST.v1",
       "tools.python.list",
       "list_python_packages",
       "python_list",
       python_list,
       "Lists the Python packages execute_python can import in this workspace (name and version; ours also marks "
       "those installed with install_python_package).",
       R"({"type":"object","properties":{},"additionalProperties":false})",
       R"({"type":"object"})",
       0,
       {},
       true},
  };
  return list;
}

}  // namespace packs

namespace {

/// The pack entry a registered name belongs to, and in which shape it answers.
const packs::Entry* entry_of(std::string_view aid, packs::Shape& shape) {
  for (const auto& e : packs::entries()) {
    if (aid == e.aid) {
      shape = packs::Shape::detailed;
      return &e;
    }
    if (aid == e.subject || aid == e.function) {
      shape = packs::Shape::service;
      return &e;
    }
  }
  return nullptr;
}

constexpr std::size_t kMaxBuckets = 10'000;

}  // namespace

const std::vector<std::string>& PackRunner::pack_names() {
  static const std::vector<std::string> names = {"files", "shell", "code", "python"};
  return names;
}

PackRunner::PackRunner(Policy policy, std::string executable)
    : policy_(std::move(policy)),
      executable_(std::move(executable)),
      spawner_(std::make_unique<Spawner>()),
      python_(std::make_unique<packs::PythonPack>(policy_, executable_)) {}

PackRunner::~PackRunner() = default;

void PackRunner::close() {
  python_->close();
}

std::vector<ToolInfo> PackRunner::tools(const std::vector<std::string>& wanted) const {
  std::vector<ToolInfo> out;
  for (const auto& e : packs::entries()) {
    if (!wanted.empty() && std::find(wanted.begin(), wanted.end(), e.pack) == wanted.end()) continue;
    for (const char* name : {e.aid, e.subject, e.function}) {
      ToolInfo info;
      info.aid = name;
      info.name = name == e.aid ? e.name : name;
      info.description = e.description;
      info.input_schema = name == e.aid ? e.schema : e.service_schema;
      info.tier = e.tier;
      info.side_effects = e.side_effects;
      info.tags = {"pack", e.pack};
      if (name != e.aid) info.alias_of = e.aid;
      if (std::string_view(e.pack) == "shell") {
        info.default_timeout_ms =
            static_cast<std::uint32_t>(std::min<std::int64_t>(policy_.shell.timeout_ms, UINT32_MAX));
      }
      if (std::string_view(e.pack) == "python" && e.handler != packs::python_list) {
        // The code's (or pip's) own limit comes first, answered as the tool's result; the
        // call's deadline is later by what installs may take, and a little.
        const PythonPolicy& p = policy_.python;
        const std::int64_t ms = e.handler == packs::python_execute ? p.timeout_ms + p.install_timeout_ms + 1000
                                                                   : p.install_timeout_ms + 1000;
        info.default_timeout_ms = static_cast<std::uint32_t>(std::min<std::int64_t>(ms, UINT32_MAX));
      }
      info.plugin_path = "pack:" + std::string(e.pack);
      out.push_back(std::move(info));
    }
  }
  return out;
}

bool PackRunner::admit(const std::string& tool, const std::string& primary, std::string_view user, std::string& why) {
  auto it = policy_.rate_limits.find(tool);
  if (it == policy_.rate_limits.end()) it = policy_.rate_limits.find(primary);
  if (it == policy_.rate_limits.end()) return true;
  const RateLimit& limit = it->second;
  const auto now = std::chrono::steady_clock::now();
  const double rate = limit.calls / limit.per_seconds;  // tokens a second
  std::lock_guard lock(rate_mu_);
  auto key = std::make_pair(it->first, std::string(user));
  auto b = buckets_.find(key);
  if (b == buckets_.end()) {
    if (buckets_.size() >= kMaxBuckets) {
      // Buckets refilled to the brim say nothing: dropped first; else the whole table
      // starts again (a flood of user names must not grow it without end).
      for (auto i = buckets_.begin(); i != buckets_.end();) {
        const RateLimit& its = policy_.rate_limits.at(i->first.first);
        const double refilled =
            std::chrono::duration<double>(now - i->second.last).count() * its.calls / its.per_seconds;
        i = i->second.tokens + refilled >= its.calls ? buckets_.erase(i) : std::next(i);
      }
      if (buckets_.size() >= kMaxBuckets) buckets_.clear();
    }
    b = buckets_.emplace(key, Bucket{limit.calls, now}).first;
  }
  Bucket& bucket = b->second;
  bucket.tokens =
      std::min(limit.calls, bucket.tokens + std::chrono::duration<double>(now - bucket.last).count() * rate);
  bucket.last = now;
  if (bucket.tokens < 1) {
    char text[64];
    std::snprintf(text, sizeof text, "%g calls per %g s", limit.calls, limit.per_seconds);
    why = "rate limit of " + std::string(text) + " for " + it->first +
          (user.empty() ? "" : " (user " + std::string(user.substr(0, 100)) + ")") + " reached; try again later";
    return false;
  }
  bucket.tokens -= 1;
  return true;
}

RunOutcome PackRunner::run(const RunSpec& spec) {
  RunOutcome out;
  packs::Shape shape = packs::Shape::detailed;
  const packs::Entry* entry = entry_of(spec.tool.info.aid, shape);
  auto refuse = [&](ErrorKind kind, std::string why) {
    out.ending = RunOutcome::Ending::failed;
    out.failure = kind;
    out.detail = std::move(why);
    return out;
  };
  if (entry == nullptr) return refuse(ErrorKind::internal_error, "no pack tool " + spec.tool.info.aid);
  std::string why;
  if (!admit(spec.tool.info.aid, entry->aid, spec.user, why))
    return refuse(ErrorKind::rate_limited, "AccessDenied: " + why);
  nlohmann::json input;
  try {
    input = nlohmann::json::parse(spec.input_json);
  } catch (const nlohmann::json::exception& e) {
    return refuse(ErrorKind::invalid_input, std::string("InvalidInput: ") + e.what());
  }
  if (!input.is_object()) return refuse(ErrorKind::invalid_input, "InvalidInput: the input must be a JSON object");
  packs::Result r;
  try {
    r = entry->handler(packs::Call{input, policy_, spec.user, spec, shape, executable_, spawner_.get(), python_.get()});
  } catch (const nlohmann::json::exception& e) {
    // A field of the wrong type the schema let through (the service names have loose schemas).
    return refuse(ErrorKind::invalid_input, std::string("InvalidInput: ") + e.what());
  }
  if (r.ending != RunOutcome::Ending::ran) {
    out.ending = r.ending;
    out.detail = r.error;
    return out;
  }
  if (r.kind != ErrorKind::none) return refuse(r.kind, std::move(r.error));
  out.ending = RunOutcome::Ending::ran;
  spec.call.set_output(r.output.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  out.rc = MACHINA_TOOL_OK;
  return out;
}

}  // namespace machina
