// A skill directory's requirements.txt, installed into a Python virtual environment of that
// skill's own before the skill starts: made once for a given file, folder and interpreter
// (its folder is named after a digest of the three), reused while they are unchanged. Hosts
// starting the same skill at once take turns (a lock file beside it): one makes it, in
// place, the others find it made. pip runs within the file-system walls of
// install_python_package: it writes only the new environment and reads only the
// interpreter's files, the system's libraries and certificates, and the skill's own folder;
// the network is open to it, and the file's own options (an index, a URL) are pip's.
#pragma once

#include <cstdint>
#include <string>

namespace machina {

struct SkillEnvironmentSpec {
  std::string name;                // the skill's (the environment's folder starts with it)
  std::string skill_dir;           // absolute; pip runs there (a requirement may name a file in it)
  std::string base_python;         // the interpreter that makes the environment (an absolute path)
  std::string sandbox_executable;  // machina-toolhost, whose --sandbox-exec puts up the walls
  std::string root;                // where the environments are kept
  std::int64_t timeout_ms = 600'000;
};

struct SkillEnvironment {
  std::string python;  // the environment's interpreter
  bool made = false;   // made by this call (false: an earlier one is reused)
};

/// The file a skill directory's dependencies are declared in.
inline constexpr const char* kSkillRequirementsFile = "requirements.txt";

/// The environment for `spec.skill_dir`'s requirements.txt: the one made before for the
/// same file and interpreter, or a new one. Throws ConfigError naming the skill, with pip's
/// own words when an install fails.
SkillEnvironment prepare_skill_environment(const SkillEnvironmentSpec& spec);

}  // namespace machina
