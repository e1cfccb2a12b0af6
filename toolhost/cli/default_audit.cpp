// The default audit store of the command line's fronts.
#include "default_audit.hpp"

#include <machina/state_home.hpp>

#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

namespace machina::cli {

void default_audit(AuditOptions& audit, bool run, bool off, bool required_named) {
  const char* env = std::getenv("MACHINA_TOOLHOST_AUDIT");
  if (off) {
    audit.db_path.clear();
    audit.jsonl_path.clear();
    return;
  }
  if (!audit.db_path.empty() || (env != nullptr && std::strcmp(env, "0") == 0)) return;
  const std::string base = state_home(/*make=*/true);
  if (base.empty()) return;  // (no home: nowhere that is the user's)
  const std::string folder = base + "/machina-toolhost";
  if (::mkdir(folder.c_str(), 0700) != 0 && errno == EEXIST) (void)::chmod(folder.c_str(), 0700);
  audit.db_path = folder + "/audit.db";
  audit.optional = true;
  audit.pending = run && audit.jsonl_path.empty();
  if (!required_named && audit.jsonl_path.empty()) audit.required = AuditRequired::none;
}

}  // namespace machina::cli
