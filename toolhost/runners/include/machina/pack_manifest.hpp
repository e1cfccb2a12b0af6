// namel3ss packs: a directory with pack.yaml (id, name, version, the tools' names, the
// runners' defaults), tools.yaml (each tool's binding: kind "python", entry "module:function",
// its runner, local, service or container, and that runner's fields; or else pack.yaml's
// entrypoints) and optionally capabilities.yaml (each tool's filesystem, network, env and
// subprocess levels and its secrets), as namel3ss lays them out. Loading turns one into the
// tools of a tool manifest (docs/python-tools.md#namel3ss-packs), or refuses it whole naming
// file, line and field.
#pragma once

#include <machina/tool_manifest.hpp>

#include <string>

namespace machina {

/// Whether `dir` is a namel3ss pack (holds a pack.yaml or a tools.yaml).
bool is_pack_dir(const std::string& dir);

/// The pack's tools: aid AID.PACK.<ID>.<TOOL>.v1 (letters and digits of each in capitals,
/// every other character '_'), name the tool's name, runner "python" (namel3ss's local) with
/// the pack folder as import root, "service" or "container", guarantees from
/// capabilities.yaml. Throws ConfigError "FILE[:LINE]: …".
ToolManifest load_pack_dir(const std::string& dir);

}  // namespace machina
