// See python_interpreter.hpp.
#include <machina/errors.hpp>
#include <machina/runners/python_interpreter.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

namespace machina {

std::string resolve_interpreter(const std::string& python, const std::string& base_dir) {
  namespace fs = std::filesystem;
  auto usable = [](const std::string& p) {
    struct stat st{};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  if (python.find('/') != std::string::npos) {
    fs::path p(python);
    if (p.is_relative()) p = fs::path(base_dir) / p;
    const std::string path = p.lexically_normal().string();
    if (!usable(path)) throw HostError("'" + python + "' is not an executable file (" + path + ")");
    return path;
  }
  const char* env_path = std::getenv("PATH");
  const std::string dirs = env_path != nullptr && *env_path != '\0' ? env_path : "/usr/local/bin:/usr/bin:/bin";
  for (std::size_t at = 0; at <= dirs.size();) {
    const std::size_t end = std::min(dirs.find(':', at), dirs.size());
    const std::string dir = end > at ? dirs.substr(at, end - at) : ".";
    const std::string candidate = dir + "/" + python;
    if (usable(candidate)) return fs::absolute(candidate).lexically_normal().string();
    at = end + 1;
  }
  throw HostError("'" + python + "' was not found on PATH");
}

}  // namespace machina
