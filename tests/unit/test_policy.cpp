// policy (the tool packs' security policy): defaults, the file's tables and their errors
// with file and line, roots made real, per-user roots, rate limits, [python].
#include <machina/errors.hpp>
#include <machina/policy.hpp>

#include <doctest/doctest.h>

#include "temp_dir.hpp"

#include <filesystem>
#include <string>

using namespace machina;
namespace fs = std::filesystem;

namespace {
std::string error_of(const std::string& text, const std::string& workspace) {
  try {
    parse_policy(text, "/etc/p.toml", workspace);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("without a file: the workspace, the default deny globs, no command") {
  TempDir tmp;
  fs::create_directories(tmp.path / "ws");
  const Policy p = default_policy((tmp.path / "ws").string());
  REQUIRE(p.files.roots.size() == 1);
  CHECK(p.files.roots[0] == fs::canonical(tmp.path / "ws").string());
  CHECK(p.files.deny == default_deny_globs());
  CHECK(p.shell.allow.empty());
  CHECK_FALSE(p.shell.network);
  CHECK_FALSE(p.shell.subprocesses);
  CHECK(p.shell.timeout_ms == 60'000);
  std::string why;
  CHECK(p.roots_for("", why) == &p.files.roots);
  CHECK(p.roots_for("anyone", why) == &p.files.roots);
}

TEST_CASE("a policy file's tables") {
  TempDir tmp;
  fs::create_directories(tmp.path / "a");
  fs::create_directories(tmp.path / "b");
  fs::create_symlink(tmp.path / "b", tmp.path / "b-link");
  const std::string text =
      "unknown_users = false\n"
      "[files]\nroots = [\"" +
      (tmp.path / "a").string() +
      "\"]\ndeny_also = [\"*.db\"]\n"
      "max_read_bytes = 10\n"
      "[shell]\nallow = [\"ls\", \"/usr/bin/git\"]\ndeny = []\ntimeout_ms = 500\nnetwork = true\n"
      "[rate_limits]\n\"AID.SHELL.EXEC.v1\" = \"10/min\"\n\"readFile\" = \"2.5/s\"\n"
      "[codebases]\nweb = \"" +
      (tmp.path / "b-link").string() +
      "\"\n"
      "[users.alice]\nroots = [\"" +
      (tmp.path / "b-link").string() + "\"]\ncodebases = [\"web\"]\n";
  const Policy p = parse_policy(text, (tmp.path / "p.toml").string(), "");
  CHECK(p.files.roots == std::vector<std::string>{fs::canonical(tmp.path / "a").string()});
  CHECK(p.files.deny.back() == "*.db");
  CHECK(p.files.deny.size() == default_deny_globs().size() + 1);
  CHECK(p.files.max_read_bytes == 10);
  CHECK(p.shell.allow == std::vector<std::string>{"ls", "/usr/bin/git"});
  CHECK(p.shell.deny.empty());
  CHECK(p.shell.timeout_ms == 500);
  CHECK(p.shell.network);
  CHECK(p.rate_limits.at("AID.SHELL.EXEC.v1").calls == 10);
  CHECK(p.rate_limits.at("AID.SHELL.EXEC.v1").per_seconds == 60);
  CHECK(p.rate_limits.at("readFile").calls == doctest::Approx(2.5));
  // Roots are kept as their real paths (a link in a root's own path is resolved once).
  CHECK(p.codebases.at("web") == fs::canonical(tmp.path / "b").string());
  std::string why;
  REQUIRE(p.roots_for("alice", why) != nullptr);
  CHECK(*p.roots_for("alice", why) == std::vector<std::string>{fs::canonical(tmp.path / "b").string()});
  CHECK(p.roots_for("bob", why) == nullptr);
  CHECK(why == "user 'bob' is not in the policy");
}

TEST_CASE("relative roots are the policy file's folder's") {
  TempDir tmp;
  fs::create_directories(tmp.path / "conf" / "work");
  const Policy p = parse_policy("[files]\nroots = [\"work\"]\n", (tmp.path / "conf" / "p.toml").string(), "");
  CHECK(p.files.roots[0] == fs::canonical(tmp.path / "conf" / "work").string());
}

TEST_CASE("errors name the file, the line, the table and the field") {
  TempDir tmp;
  const std::string ws = tmp.path.string();
  CHECK(error_of("[files]\nroots = [\"/no/such\"]\n", ws) ==
        "/etc/p.toml:2: [files]: field 'roots': '/no/such' is not a directory");
  CHECK(error_of("[shell]\nallow = 3\n", ws) ==
        "/etc/p.toml:2: [shell]: field 'allow': must be an array of strings, not an integer");
  CHECK(error_of("[shell]\ntimeout_ms = 0\n", ws) ==
        "/etc/p.toml:2: [shell]: field 'timeout_ms': must be from 1 to 86400000");
  CHECK(error_of("[shell]\nallw = []\n", ws) == "/etc/p.toml:2: [shell]: unknown field 'allw' (did you mean 'allow'?)");
  CHECK(error_of("[rate_limits]\nx = \"0/s\"\n", ws) ==
        "/etc/p.toml:2: [rate_limits]: field 'x': must be like \"10/s\", \"100/min\" or \"1000/h\"");
  CHECK(error_of("[code]\nrg = \"rg\"\n", ws) == "/etc/p.toml:2: [code]: field 'rg': must be an absolute path");
  CHECK(error_of("shell = 1\n", ws) == "/etc/p.toml:1: 'shell' must be a table ([shell])");
  CHECK(error_of("[users]\nbob = 1\n", ws) == "/etc/p.toml:2: [users]: 'bob' must be a table ([users.bob])");
  CHECK(error_of("x = [\n", ws).rfind("/etc/p.toml:", 0) == 0);
}

TEST_CASE("code.search's settings: the index folder outside every root, codebases per caller") {
  TempDir tmp;
  for (const char* d : {"ws", "web", "api", "alice"}) fs::create_directories(tmp.path / d);
  const std::string t = tmp.path.string();
  const Policy p = parse_policy(
      "[code]\nindex_dir = \"idx\"\nmax_index_files = 7\nmax_index_bytes = 8\n"
      "max_refresh_bytes = 9\ndefault_codebases = [\"api\"]\n"
      "[codebases]\nweb = \"" +
          t + "/web\"\napi = \"" + t +
          "/api\"\n"
          "[users.alice]\nroots = [\"" +
          t + "/alice\"]\ncodebases = [\"web\"]\n[users.bob]\n",
      t + "/p.toml", t + "/ws");
  CHECK(p.code.index_dir == fs::canonical(tmp.path).string() + "/idx");  // relative: the policy file's folder
  CHECK(p.code.index_dir_conflict.empty());
  CHECK(p.code.max_index_files == 7);
  CHECK(p.code.max_index_bytes == 8);
  CHECK(p.code.max_refresh_bytes == 9);
  std::string why;
  CHECK(*p.codebases_for("alice", why) == std::vector<std::string>{"web"});
  CHECK(p.codebases_for("bob", why)->empty());                          // listed: their own (none)
  CHECK(*p.codebases_for("", why) == std::vector<std::string>{"api"});  // no user: the defaults
  CHECK(*p.codebases_for("carol", why) == std::vector<std::string>{"api"});
  const Policy strict = parse_policy("unknown_users = false\n", t + "/p.toml", t + "/ws");
  CHECK(strict.codebases_for("carol", why) == nullptr);
  CHECK(why == "user 'carol' is not in the policy");
  CHECK(strict.codebases_for("", why)->empty());

  // Overlapping a root either way is refused at load, naming the line.
  CHECK(root_overlapping(p, t + "/web/x") == fs::canonical(tmp.path / "web").string());
  CHECK(root_overlapping(p, t) == fs::canonical(tmp.path / "ws").string());  // holds a root
  CHECK(root_overlapping(p, t + "/webby") == "");
  CHECK(error_of("[code]\nindex_dir = \"" + t + "/ws/.idx\"\n", t + "/ws") ==
        "/etc/p.toml:2: [code]: field 'index_dir': '" + t + "/ws/.idx' overlaps the root '" + t +
            "/ws' (the index must lie outside every root, codebase and user root)");
  CHECK(error_of("\n[code]\ndefault_codebases = [\"web\"]\n", t) ==
        "/etc/p.toml:3: [code]: field 'default_codebases': 'web' is not in [codebases]");
}

TEST_CASE("the default index folder: the user's cache, unless it falls in a root") {
  TempDir tmp;
  fs::create_directories(tmp.path / "ws");
  const char* old = std::getenv("XDG_CACHE_HOME");
  const std::string saved = old != nullptr ? old : "";
  ::setenv("XDG_CACHE_HOME", (tmp.path / "cache").c_str(), 1);
  CHECK(default_index_dir() == (tmp.path / "cache" / "machina-toolhost" / "code-index").string());
  const Policy fine = default_policy((tmp.path / "ws").string());
  CHECK(fine.code.index_dir_conflict.empty());
  ::setenv("XDG_CACHE_HOME", (tmp.path / "ws" / ".cache").c_str(), 1);
  const Policy inside = default_policy((tmp.path / "ws").string());
  CHECK(inside.code.index_dir_conflict.find("overlaps the root " + fs::canonical(tmp.path / "ws").string()) !=
        std::string::npos);
  const Policy set = parse_policy("[code]\nindex_dir = \"" + (tmp.path / "idx").string() + "\"\n",
                                  (tmp.path / "p.toml").string(), (tmp.path / "ws").string());
  CHECK(set.code.index_dir_conflict.empty());  // set in the file: the default's conflict is no more
  ::setenv("XDG_CACHE_HOME", "relative/ignored", 1);
  CHECK(default_index_dir().find("relative") == std::string::npos);
  if (old != nullptr)
    ::setenv("XDG_CACHE_HOME", saved.c_str(), 1);
  else
    ::unsetenv("XDG_CACHE_HOME");
}

TEST_CASE("[python]: defaults, paths made absolute, scopes") {
  TempDir tmp;
  fs::create_directories(tmp.path / "ws");
  const Policy d = default_policy((tmp.path / "ws").string());
  CHECK(d.python.python == "python3");
  CHECK(d.python.workspaces.empty());
  CHECK(d.python.timeout_ms == 30'000);
  CHECK(d.python.memory_mb == 512);
  CHECK(d.python.allow == std::vector<std::string>{"*"});
  CHECK(d.python.only_binary);
  CHECK_FALSE(d.python.allow_urls);
  const std::string text =
      "[python]\npython = \"bin/python\"\nworkspaces = \"pyws\"\ntimeout_ms = 500\n"
      "find_links = [\"wheels\", \"https://example.org/w/\"]\nallow = []\nmax_sessions = 0\n"
      "[users.alice]\n";
  const Policy p = parse_policy(text, (tmp.path / "conf" / "p.toml").string(), "");
  CHECK(p.python.python == (tmp.path / "conf" / "bin" / "python").string());
  CHECK(p.python.workspaces == (tmp.path / "conf" / "pyws").string());
  CHECK(p.python.timeout_ms == 500);
  CHECK(p.python.find_links ==
        std::vector<std::string>{(tmp.path / "conf" / "wheels").string(), "https://example.org/w/"});
  CHECK(p.python.allow.empty());
  CHECK(p.python.max_sessions == 0);
  CHECK(p.scope_of("alice") == "alice");
  CHECK(p.scope_of("bob").empty());  // not listed: the defaults' scope
  CHECK(p.scope_of("").empty());
}

TEST_CASE("[python]: errors") {
  TempDir tmp;
  const std::string ws = tmp.path.string();
  CHECK(error_of("[python]\nmemory_mb = -1\n", ws) ==
        "/etc/p.toml:2: [python]: field 'memory_mb': must be from 0 to 1048576");
  CHECK(error_of("[python]\npython = \"\"\n", ws) ==
        "/etc/p.toml:2: [python]: field 'python': must name an interpreter");
  CHECK(error_of("[python]\nworkers = 0\n", ws) == "/etc/p.toml:2: [python]: field 'workers': must be from 1 to 64");
  CHECK(error_of("[python]\ndeny = [\"\"]\n", ws) ==
        "/etc/p.toml:2: [python]: field 'deny': a package name (or glob) must not be empty");
  CHECK(error_of("[python]\nindex_url = \"pypi.org\"\n", ws) ==
        "/etc/p.toml:2: [python]: field 'index_url': must be an http:// or https:// URL");
  CHECK(error_of("[python]\nsesion_idle_ms = 1\n", ws) ==
        "/etc/p.toml:2: [python]: unknown field 'sesion_idle_ms' (did you mean 'session_idle_ms'?)");
}
