// Folders of execute_python's workspaces (docs/tool-packs.md#execute_python), handled by the
// host while sandboxed code of the same workspace may be writing beside it: every step is
// taken beneath a directory descriptor and follows no link, so that a link or a folder
// swapped in by the code leads nowhere outside.
#pragma once

#include <machina/policy.hpp>

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace machina::packs::python_files {

/// Makes `path` and the folders above it that are missing (mode 0700). False with `why`.
bool make_dirs(const std::string& path, std::string& why);

/// Removes `path` (a folder with everything beneath it, or a file, or a link itself),
/// following no link; a folder made deeper than the descriptors it may hold is moved up
/// and removed from there. Nothing there: true. False with `why` when something is left.
bool remove_tree(const std::string& path, std::string& why);

/// What a workspace copy took and left out.
struct Copied {
  std::uint64_t files = 0;
  std::uint64_t bytes = 0;
  std::uint64_t skipped = 0;  // denied names, links, FIFOs, sockets, devices, hard-linked and protected files
};

enum class CopyEnd { done, over_cap, failed };

/// Copies the regular files beneath `root` into the folder `dest` (made if missing), over
/// what is there by the same names: the way the file tools see them (no denied name, no
/// link, no hard-linked file, not the lease key), no folder in `skip` (device, inode) and no
/// deeper than `max_depth`. Counts first: past `max_files` or `max_bytes` nothing is copied
/// (over_cap). `why` says what failed.
CopyEnd copy_root(const Policy& policy, const std::string& root, const std::string& dest,
                  const std::vector<std::pair<dev_t, ino_t>>& skip, std::uint64_t max_files, std::uint64_t max_bytes,
                  Copied& copied, std::string& why);

/// An exclusive flock(2) on the file `path` (made if missing): its descriptor, held until
/// closed. `wait`: blocks until it is free; else -1 with errno EWOULDBLOCK when it is taken.
/// -1 with `why` otherwise.
int lock_file(const std::string& path, bool wait, std::string& why);

}  // namespace machina::packs::python_files
