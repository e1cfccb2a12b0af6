// Where this build of machina-toolhost finds the files installed with the machina_dispatch
// package (the other builds, the built-in plugin pack, the docs), and the hand-over to
// another build in this process's place. Compiled into each build (MACHINA_LINKED_TOOLS,
// MACHINA_WITH_NATS and MACHINA_PACKAGE_RELDIRS differ between them).
#pragma once

#include <string>

namespace machina::cli {

/// Where a file of the installed machina_dispatch package (or of the build tree) is, given
/// its path inside the package: next to the Python package (found relative to this
/// executable), else relative to the executable as laid out in the build tree. Throws
/// ConfigError listing the places looked at, with `hint`.
std::string find_package_file(const std::string& inside, const std::string& what, const std::string& hint);

/// $MACHINA_TOOLHOST_PLUGIN_DIR when set and not empty, else nullptr.
const char* builtin_plugin_dir();

#ifndef MACHINA_WITH_NATS
/// --nats is served by the build of this program linked with the NATS client (a shared
/// library, which the other builds do not load at every start), in the package's
/// libexec/nats/.
[[noreturn]] void hand_over_to_nats_build(char** argv);
#endif

#ifdef MACHINA_LINKED_TOOLS
/// Plugin libraries (named, or the built-in pack from MACHINA_TOOLHOST_PLUGIN_DIR) are
/// loaded by the dynamically linked build of this program, installed in the package's
/// libexec/: it is run in this process's place with the same arguments.
bool needs_plugin_loader(bool plugins_named);
[[noreturn]] void hand_over_to_plugin_loader(char** argv);
#else
/// The built-in plugin pack: $MACHINA_TOOLHOST_PLUGIN_DIR, else in the installed Python
/// package (relative to this executable), else in the build tree.
std::string find_builtin_plugin();
#endif

}  // namespace machina::cli
