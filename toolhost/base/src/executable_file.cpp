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

std::vector<std::string> path_folders() {
  const char* env_path = std::getenv("PATH");
  const std::string dirs = env_path != nullptr && *env_path != '\0' ? env_path : "/usr/local/bin:/usr/bin:/bin";
  std::vector<std::string> folders;
  for (std::size_t at = 0; at <= dirs.size();) {
    const std::size_t end = std::min(dirs.find(':', at), dirs.size());
    folders.push_back(end > at ? dirs.substr(at, end - at) : ".");
    at = end + 1;
  }
  return folders;
}

std::string find_on_path(const std::string& name) {
  for (const std::string& folder : path_folders()) {
    const std::string candidate = folder + "/" + name;
    if (executable_file(candidate)) return std::filesystem::absolute(candidate).lexically_normal().string();
  }
  return {};
}

}  // namespace machina
