// python_entry_check (a Python tool's `entry` checked when its manifest is loaded): a
// module that binds the name passes, in every way a module binds one; a syntax error and
// a missing name are reported with the module's path; modules not beneath the root, and an
// interpreter that cannot start, are left to the call; nothing of the module runs.
#include <machina/python_entry_check.hpp>

#include <doctest/doctest.h>

#include "temp_dir.hpp"

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

using namespace machina;
namespace fs = std::filesystem;

namespace {

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::string python() {
  for (const char* p : {"/usr/bin/python3", "/usr/local/bin/python3"}) {
    if (fs::exists(p)) return p;
  }
  return "";
}

}  // namespace

TEST_CASE("entries whose module binds the name pass, others say why") {
  const std::string py = python();
  if (py.empty()) {
    MESSAGE("no python3 in /usr/bin or /usr/local/bin: skipped");
    return;
  }
  TempDir tmp;
  const fs::path marker = tmp.path / "ran";
  write(tmp.path / "good.py",
        "import os, json as j\n"
        "from sys import argv as args\n"
        "open(" +
            ("'" + marker.string() + "'") +
            ", 'w')  # never runs: the module is only parsed\n"
            "def run(x): return x\n"
            "async def arun(x): return x\n"
            "class Tool:\n    def call(self): pass\n"
            "a, (b, c) = 1, (2, 3)\n"
            "n: int = 1\n"
            "for loop_var in []: pass\n"
            "with open(__file__) as handle: pass\n"
            "if True:\n    under_if = 1\nelse:\n    under_else = 2\n"
            "try:\n    import missing_mod as in_try\nexcept ImportError:\n    in_handler = None\n"
            "def outer():\n    hidden = 1\n");
  write(tmp.path / "pkg" / "__init__.py", "def run(x): return x\n");
  write(tmp.path / "pkg" / "sub.py", "value = 1\n");
  write(tmp.path / "star.py", "from os.path import *\n");
  write(tmp.path / "lazy.py", "def __getattr__(name): return name\n");
  write(tmp.path / "broken.py", "def run(:\n");
  const std::vector<std::string> good{"good:run",      "good:arun",       "good:Tool.call", "good:a",
                                      "good:c",        "good:n",          "good:loop_var",  "good:handle",
                                      "good:under_if", "good:under_else", "good:in_try",    "good:in_handler",
                                      "good:os",       "good:j",          "good:args",      "pkg:run",
                                      "pkg.sub:value", "star:anything",   "lazy:whatever",  "installed.mod:f"};
  const auto bad = find_bad_python_entries(py, tmp.path.string(), [&] {
    auto all = good;
    for (const char* e : {"good:missing", "good:hidden", "pkg.sub:run", "broken:run"}) {
      all.push_back(e);
    }
    return all;
  }());
  for (const auto& e : good) {
    CAPTURE(e);
    CHECK(bad.count(e) == 0);
  }
  CHECK(bad.size() == 4);
  CHECK(bad.at("good:missing") == "good.py defines no 'missing'");
  CHECK(bad.at("good:hidden") == "good.py defines no 'hidden'");
  CHECK(bad.at("pkg.sub:run") == "pkg/sub.py defines no 'run'");
  CHECK(bad.at("broken:run").rfind("broken.py line 1: ", 0) == 0);
  CHECK_FALSE(fs::exists(marker));
}

TEST_CASE("nothing to check, or an interpreter that cannot start: nothing is reported") {
  TempDir tmp;
  write(tmp.path / "m.py", "x = 1\n");
  CHECK(find_bad_python_entries("/nonexistent/python3", tmp.path.string(), {"m:missing"}).empty());
  CHECK(find_bad_python_entries("/bin/false", tmp.path.string(), {"m:missing"}).empty());
  CHECK(find_bad_python_entries(python().empty() ? "/bin/false" : python(), tmp.path.string(), {}).empty());
}
