// What the tools must not reach: the lease key file (refused inside their workspace) and the
// audit store's files (refused under their roots, protected by identity besides).
#include <machina/tool_host.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iterator>

#include <sys/stat.h>

namespace machina {

void ToolHost::refuse_key_file_in_workspace() {
  // The built-in file tools read anything under their workspace (nothing outside it):
  // the key file must not be there for them to find.
  const char* key_file = std::getenv("MACHINA_LEASE_KEY_FILE");
  if (key_file == nullptr || *key_file == '\0') return;
  const char* root = std::getenv("MACHINA_TOOLHOST_WORKSPACE");
  std::error_code ec1, ec2;
  const auto key = std::filesystem::weakly_canonical(key_file, ec1);
  const auto workspace = std::filesystem::weakly_canonical(root != nullptr && *root != '\0' ? root : ".", ec2);
  if (ec1 || ec2) return;  // (a key file that cannot be read is refused when it is read)
  const auto rel = key.lexically_relative(workspace);
  if (!rel.empty() && *rel.begin() != "..") {
    throw ConfigError("the lease key file " + key.string() + " lies inside the tools' workspace " + workspace.string() +
                      ": move it out (the file tools would read it)");
  }
}

void ToolHost::keep_audit_out_of_reach(Policy& policy) const {
  // The store records what every tool did: no tool may read, change or remove it. Roots
  // that hold it are refused; its files are protected by identity as the lease key is.
  std::vector<std::string> roots = policy.files.roots;
  for (const auto& [name, scope] : policy.users) roots.insert(roots.end(), scope.roots.begin(), scope.roots.end());
  for (const auto& [id, root] : policy.codebases) roots.push_back(root);
  std::vector<std::filesystem::path> bases;
  for (const auto& root : roots) {
    std::error_code ec;
    auto base = std::filesystem::weakly_canonical(root, ec);
    if (!ec) bases.push_back(std::move(base));
  }
  // The store's files share a folder or two: each folder is resolved once, and a file by
  // itself only when it is a symbolic link.
  std::vector<std::pair<std::filesystem::path, std::filesystem::path>> folders;  // as named, resolved
  for (const auto& file : host_.audit()->files()) {
    std::error_code ec;
    const std::filesystem::path named(file);
    std::filesystem::path path;
    struct stat link{};
    if (::lstat(file.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
      path = std::filesystem::weakly_canonical(named, ec);
    } else {
      const auto folder = named.parent_path();
      auto it = std::find_if(folders.begin(), folders.end(), [&](const auto& f) { return f.first == folder; });
      if (it == folders.end()) {
        folders.emplace_back(folder, std::filesystem::weakly_canonical(folder.empty() ? "." : folder, ec));
        it = std::prev(folders.end());
      }
      if (it->second.empty()) continue;  // (a folder that could not be resolved)
      path = it->second / named.filename();
    }
    if (ec || path.is_relative()) continue;
    for (const auto& base : bases) {
      const auto rel = path.lexically_relative(base);
      if (!rel.empty() && *rel.begin() != "..") {
        throw ConfigError("the audit store's file " + path.string() + " lies inside the tools' root " + base.string() +
                          ": put it where no tool reaches");
      }
    }
    // Protected by identity too (against a link made to it), but for the files that come
    // and go: an inode they leave is another file's next.
    struct stat st{};
    if (!AuditLog::comes_and_goes(file) && ::stat(path.c_str(), &st) == 0)
      policy.protected_files.emplace_back(st.st_dev, st.st_ino);
  }
}

}  // namespace machina
