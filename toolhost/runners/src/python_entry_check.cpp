// See python_entry_check.hpp.
#include <machina/child_process.hpp>
#include <machina/python_entry_check.hpp>

#include <nlohmann/json.hpp>

#include <chrono>

namespace machina {
namespace {

// Reads {"root", "entries"} on stdin; writes {entry: why} for the entries that cannot be
// right. A module that star-imports, or whose name is bound by other means (globals(),
// setattr), is judged only by what its text binds at top level: a star import passes it.
constexpr const char* kCheck = R"(import ast, json, os, sys
req = json.load(sys.stdin)
bad = {}
for entry in req["entries"]:
    module, _, attr = entry.partition(":")
    first = attr.split(".")[0]
    rel = module.replace(".", os.sep)
    for path in (os.path.join(req["root"], rel + ".py"), os.path.join(req["root"], rel, "__init__.py")):
        if not os.path.isfile(path):
            continue
        try:
            with open(path, "rb") as f:
                tree = ast.parse(f.read(), path)
        except SyntaxError as e:
            bad[entry] = f"{os.path.relpath(path, req['root'])} line {e.lineno}: {e.msg}"
            break
        except (OSError, ValueError):
            break
        names, star = set(), False
        def bind(target):
            for node in ast.walk(target):
                if isinstance(node, ast.Name):
                    names.add(node.id)
        def collect(body):
            global star
            for node in body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(node.name)
                elif isinstance(node, (ast.Import, ast.ImportFrom)):
                    for a in node.names:
                        if a.name == "*":
                            star = True
                        names.add(a.asname or a.name.split(".")[0])
                elif isinstance(node, ast.Assign):
                    for t in node.targets:
                        bind(t)
                elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor)):
                    bind(node.target)
                elif isinstance(node, (ast.With, ast.AsyncWith)):
                    for item in node.items:
                        if item.optional_vars is not None:
                            bind(item.optional_vars)
                for field in ("body", "orelse", "finalbody"):  # names bound under a condition count
                    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        collect(getattr(node, field, []) or [])
                for handler in getattr(node, "handlers", []) or []:
                    collect(handler.body)
        collect(tree.body)
        if first not in names and "__getattr__" not in names and not star:
            bad[entry] = f"{os.path.relpath(path, req['root'])} defines no '{first}'"
        break
print(json.dumps(bad))
)";

}  // namespace

std::map<std::string, std::string> find_bad_python_entries(const std::string& python, const std::string& root,
                                                           const std::vector<std::string>& entries) {
  std::map<std::string, std::string> bad;
  if (entries.empty()) return bad;
  ChildSpec spec;
  spec.executable = python;
  spec.argv = {python, "-I", "-S", "-c", kCheck};
  spec.env = pick_environment({"PATH", "LANG"});
  ChildOutcome ran;
  try {
    ran = run_to_completion(spec, nlohmann::json{{"root", root}, {"entries", entries}}.dump(), std::chrono::seconds(30),
                            1 << 20);
  } catch (const std::exception&) {
    return bad;  // (the interpreter cannot be started: its calls will say so)
  }
  if (ran.ended != ChildOutcome::Ended::exited || ran.exit_code != 0) return bad;
  const auto answer = nlohmann::json::parse(ran.stdout_text, nullptr, false);
  if (!answer.is_object()) return bad;
  for (const auto& [entry, why] : answer.items()) {
    if (why.is_string()) bad.emplace(entry, why.get<std::string>());
  }
  return bad;
}

}  // namespace machina
