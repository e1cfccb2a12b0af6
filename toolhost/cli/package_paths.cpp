// Where this build finds the package's files, and the hand-over to another build.
#include "package_paths.hpp"

#include "say.hpp"

#include <machina/errors.hpp>
#include <machina/tool_host.hpp>  // kBuiltinPluginFile

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <vector>

#ifndef MACHINA_PACKAGE_RELDIRS
#define MACHINA_PACKAGE_RELDIRS ""
#endif

namespace fs = std::filesystem;

namespace machina::cli {

std::string find_package_file(const std::string& inside, const std::string& what, const std::string& hint) {
  // Plain strings and access(2): the first candidate (this interpreter's default install
  // scheme) is nearly always the one.
  std::vector<std::string> tried;
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    std::string exe_dir(exe, static_cast<std::size_t>(n));
    exe_dir.resize(exe_dir.rfind('/') + 1);
    // The plugin-loading build lives in the package's (or build tree's) libexec/, the build
    // that serves NATS in libexec/nats/.
    if (exe_dir.size() > 9 && exe_dir.ends_with("/libexec/")) tried.push_back(exe_dir + "../" + inside);
    if (exe_dir.size() > 14 && exe_dir.ends_with("/libexec/nats/")) tried.push_back(exe_dir + "../../" + inside);
    const std::string_view reldirs = MACHINA_PACKAGE_RELDIRS;
    for (std::size_t at = 0; at <= reldirs.size();) {
      const std::size_t end = std::min(reldirs.find(':', at), reldirs.size());
      if (end > at) tried.push_back(exe_dir + std::string(reldirs.substr(at, end - at)) + "/" + inside);
      at = end + 1;
    }
    tried.push_back(exe_dir + inside);
  }
  for (const auto& p : tried) {
    if (::access(p.c_str(), R_OK) == 0) return fs::path(p).lexically_normal().string();
  }
  std::string where;
  for (const auto& p : tried) where += "\n  " + fs::path(p).lexically_normal().string();
  throw ConfigError(what + " not found; looked for:" + where + "\n" + hint);
}

const char* builtin_plugin_dir() {
  const char* dir = std::getenv("MACHINA_TOOLHOST_PLUGIN_DIR");
  return dir != nullptr && *dir != '\0' ? dir : nullptr;
}

#if defined(MACHINA_LINKED_TOOLS) || !defined(MACHINA_WITH_NATS)
namespace {

/// Runs the build of this program found at `inside` the package (see find_package_file) in
/// this process's place with the same arguments; `purpose` words what for, on failure.
[[noreturn]] void hand_over(char** argv, const std::string& inside, const std::string& what,
                            const std::string& purpose) {
  std::string build;
  try {
    build = find_package_file(inside, what, "it is installed with the machina_dispatch package; reinstall it");
  } catch (const ConfigError& e) {
    say("cannot " + purpose + ": " + e.what());
    _exit(2);
  }
  ::execv(build.c_str(), argv);
  say("cannot start " + build + ": " + std::strerror(errno));
  _exit(2);
}

}  // namespace
#endif

#ifndef MACHINA_WITH_NATS
void hand_over_to_nats_build(char** argv) {
  hand_over(argv, "libexec/nats/machina-toolhost", "the build of machina-toolhost that serves NATS", "serve NATS");
}
#endif

#ifdef MACHINA_LINKED_TOOLS
bool needs_plugin_loader(bool plugins_named) {
  return plugins_named || builtin_plugin_dir() != nullptr;
}

void hand_over_to_plugin_loader(char** argv) {
  hand_over(argv, "libexec/machina-toolhost", "the plugin-loading build of machina-toolhost", "load plugins");
}
#else
std::string find_builtin_plugin() {
  const std::string file(kBuiltinPluginFile);
  if (const char* dir = builtin_plugin_dir()) return (fs::path(dir) / file).string();
  return find_package_file("plugins/" + file, "built-in plugins",
                           "set MACHINA_TOOLHOST_PLUGIN_DIR or name a plugin with --plugin");
}
#endif

}  // namespace machina::cli
