// Where this program keeps its state on disk (the default audit store, the skills' data,
// the Python workspaces): the user's state folder of the XDG Base Directory specification.
#pragma once

#include <string>

namespace machina {

/// $XDG_STATE_HOME when it is an absolute path (a relative one is ignored, as the
/// specification says), else ~/.local/state with an absolute $HOME; "" when neither.
/// `make`: the folders it names that are missing are made, the user's only (0700).
std::string state_home(bool make = false);

/// machina-toolhost/ in state_home(), else (no home) in /tmp/machina-toolhost-<uid>/.
std::string toolhost_state_dir();

}  // namespace machina
