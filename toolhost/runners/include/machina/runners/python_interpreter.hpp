// Which Python interpreter a tool, a skill or execute_python runs.
#pragma once

#include <string>

namespace machina {

/// The interpreter to run: `python` as a path (relative to `base_dir`) when it holds a
/// slash, else looked up on PATH. Throws ConfigError when it is not an executable file.
std::string resolve_interpreter(const std::string& python, const std::string& base_dir);

}  // namespace machina
