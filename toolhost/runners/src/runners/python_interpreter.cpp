// See python_interpreter.hpp.
#include <machina/errors.hpp>
#include <machina/executable_file.hpp>
#include <machina/runners/python_interpreter.hpp>

#include <filesystem>

namespace machina {

std::string resolve_interpreter(const std::string& python, const std::string& base_dir) {
  if (python.find('/') != std::string::npos) {
    std::filesystem::path p(python);
    if (p.is_relative()) p = std::filesystem::path(base_dir) / p;
    const std::string path = p.lexically_normal().string();
    if (!executable_file(path)) throw ConfigError("'" + python + "' is not an executable file (" + path + ")");
    return path;
  }
  std::string found = find_on_path(python);
  if (found.empty()) throw ConfigError("'" + python + "' was not found on PATH");
  return found;
}

}  // namespace machina
