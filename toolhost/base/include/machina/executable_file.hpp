// Whether a path is a program this process can run, and finding one by its name on PATH.
#pragma once

#include <string>

namespace machina {

/// Whether `path` is a regular file (after symlinks) this process may execute.
bool executable_file(const std::string& path);

/// The first executable_file `name` in the folders of $PATH (an empty entry: the working
/// directory; no PATH: /usr/local/bin:/usr/bin:/bin), as an absolute path; "" when none.
std::string find_on_path(const std::string& name);

}  // namespace machina
