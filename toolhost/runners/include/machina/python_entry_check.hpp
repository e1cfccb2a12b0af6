// A Python tool's `entry` (module:function) checked when its manifest is loaded, not at its
// first call: the module's source, found beneath the tool's import root, is read by the
// tool's interpreter as a syntax tree (-I -S: nothing of it, nor of any installed package,
// runs) for a top-level name the entry's first attribute can be. A module not found beneath
// the root (an installed one) is left to the call.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace machina {

/// For each entry of `entries` that cannot be right, why (a syntax error in its module, or a
/// module that binds no such name); entries not in the map passed or could not be judged.
/// `python`: the interpreter (an absolute path); `root`: the folder modules are imported from.
std::map<std::string, std::string> find_bad_python_entries(const std::string& python, const std::string& root,
                                                           const std::vector<std::string>& entries);

}  // namespace machina
