// namel3ss packs: a directory with pack.yaml (id, name, version, the tools' names),
// tools.yaml (each tool's binding: kind "python", entry "module:function") and optionally
// capabilities.yaml (each tool's filesystem, network, env and subprocess levels and its
// secrets), as namel3ss lays them out. Loading turns one into the Python tools of a tool
// manifest (docs/python-tools.md#namel3ss-packs), or refuses it whole naming file, line and field.
#pragma once

#include <machina/tool_manifest.hpp>

#include <string>

namespace machina {

/// Whether `dir` is a namel3ss pack (holds a pack.yaml or a tools.yaml).
bool is_pack_dir(const std::string& dir);

/// The pack's tools: aid AID.PACK.<ID>.<TOOL>.v1 (letters and digits of each in capitals,
/// every other character '_'), name the tool's name, runner "python" with the pack folder as
/// import root, guarantees from capabilities.yaml. Throws ConfigError "FILE[:LINE]: …".
ToolManifest load_pack_dir(const std::string& dir);

}  // namespace machina
