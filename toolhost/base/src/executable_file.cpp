// See executable_file.hpp.
#include <machina/executable_file.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

namespace machina {

bool executable_file(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

std::string find_on_path(const std::string& name) {
  const char* env_path = std::getenv("PATH");
  const std::string dirs = env_path != nullptr && *env_path != '\0' ? env_path : "/usr/local/bin:/usr/bin:/bin";
  for (std::size_t at = 0; at <= dirs.size();) {
    const std::size_t end = std::min(dirs.find(':', at), dirs.size());
    const std::string candidate = (end > at ? dirs.substr(at, end - at) : ".") + "/" + name;
    if (executable_file(candidate)) return std::filesystem::absolute(candidate).lexically_normal().string();
    at = end + 1;
  }
  return {};
}

}  // namespace machina
