// Whether a path is a program this process can run, and finding one by its name on PATH.
#pragma once

#include <string>
#include <vector>

namespace machina {

/// Whether `path` is a regular file (after symlinks) this process may execute.
bool executable_file(const std::string& path);

/// The first executable_file `name` in the folders of $PATH (an empty entry: the working
/// directory; no PATH: /usr/local/bin:/usr/bin:/bin), as an absolute path; "" when none.
std::string find_on_path(const std::string& name);

/// The folders of $PATH as find_on_path searches them, in order.
std::vector<std::string> path_folders();

}  // namespace machina
