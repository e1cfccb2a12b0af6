// The audit store the command line's fronts use unless told otherwise.
#pragma once

#include <machina/audit.hpp>

namespace machina::cli {

/// The audit store of the executable's fronts: on unless `off` (--no-audit) or
/// MACHINA_TOOLHOST_AUDIT=0; a store named (--audit-db, --audit-jsonl or their variables)
/// is used as named, else the default one, $XDG_STATE_HOME/machina-toolhost/audit.db (or
/// ~/.local/state/...), in a folder of the user's only. The default store is optional: where
/// it cannot be made the host warns and serves without, and a store that cannot record
/// refuses no call unless `required_named` (--audit-required) or a JSON lines file is named.
/// A call per process (`run`) appends to the store's pending file (AuditOptions::pending).
void default_audit(AuditOptions& audit, bool run, bool off, bool required_named);

}  // namespace machina::cli
