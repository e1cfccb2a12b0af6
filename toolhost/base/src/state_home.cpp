// See state_home.hpp.
#include <machina/state_home.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

namespace machina {

std::string state_home(bool make) {
  if (const char* state = std::getenv("XDG_STATE_HOME"); state != nullptr && *state == '/') {
    if (make) (void)::mkdir(state, 0700);
    return state;
  }
  const char* home = std::getenv("HOME");
  if (home == nullptr || *home != '/') return {};
  std::string dir = std::string(home) + "/.local";
  if (make) (void)::mkdir(dir.c_str(), 0700);
  dir += "/state";
  if (make) (void)::mkdir(dir.c_str(), 0700);
  return dir;
}

std::string toolhost_state_dir() {
  std::string base = state_home();
  if (base.empty()) base = "/tmp/machina-toolhost-" + std::to_string(::getuid());
  return base + "/machina-toolhost";
}

}  // namespace machina
