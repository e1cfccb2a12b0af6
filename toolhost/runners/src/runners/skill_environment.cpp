// See skill_environment.hpp.
#include <machina/runners/skill_environment.hpp>

#include "../pip_walls.hpp"

#include <machina/child_process.hpp>
#include <machina/errors.hpp>
#include <machina/isolation/sandbox_exec.hpp>
#include <machina/python_sandbox.hpp>
#include <machina/sha256_hex.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>
#include <vector>

namespace machina {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t kMaxRequirementsBytes = 1 << 20;
constexpr std::size_t kMaxStepOutputBytes = 1 << 20;  // what pip or venv may write
constexpr const char* kReadyMark = ".machina-ready";  // written last: the environment is whole
constexpr std::string_view kNul("\0", 1);             // after each part of the folder's digest

/// The skill's name as a folder name: letters, digits, '-' and '_'; anything else '_'.
std::string folder_word(const std::string& name) {
  std::string out;
  for (char c : name.substr(0, 64)) {
    out += std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '-' ? c : '_';
  }
  return out.empty() ? "skill" : out;
}

[[noreturn]] void refuse(const SkillEnvironmentSpec& spec, const std::string& why) {
  throw ConfigError("skill " + spec.name + ": " + kSkillRequirementsFile + ": " + why);
}

/// Runs `child` to its end within `limit`; its exit code, or a refusal naming `what`.
ChildOutcome run_step(const SkillEnvironmentSpec& spec, ChildSpec child, std::int64_t limit_ms,
                      const std::string& what) {
  child.tail_bytes = 8192;
  ChildOutcome run;
  try {
    run = run_to_completion(std::move(child), "", std::chrono::milliseconds(limit_ms), kMaxStepOutputBytes);
  } catch (const ConfigError& e) {
    refuse(spec, what + " could not be started: " + e.what());
  }
  if (run.ended == ChildOutcome::Ended::timed_out) {
    refuse(spec, what + " did not finish within " + std::to_string(limit_ms / 1000) + " s");
  }
  return run;
}

std::string trimmed(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

}  // namespace

SkillEnvironment prepare_skill_environment(const SkillEnvironmentSpec& spec) {
  const fs::path requirements = fs::path(spec.skill_dir) / kSkillRequirementsFile;
  std::ifstream in(requirements, std::ios::binary);
  if (!in) refuse(spec, "cannot be read");
  std::string text(kMaxRequirementsBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) refuse(spec, "cannot be read");
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > kMaxRequirementsBytes) refuse(spec, "is over " + std::to_string(kMaxRequirementsBytes) + " bytes");

  // The interpreter's own folders name its version (lib/python3.X): another version, or
  // another interpreter, is another environment.
  InterpreterFiles base;
  try {
    base = interpreter_files(spec.base_python);
  } catch (const ConfigError& e) {
    refuse(spec, e.what());
  }
  std::string interpreter = base.executable;
  for (const auto& path : base.paths) interpreter += "\n" + path;
  const fs::path root(spec.root);
  const fs::path env =
      root / (folder_word(spec.name) + "-" + sha256_hex({interpreter, kNul, spec.skill_dir, kNul, text, kNul}, 8));
  SkillEnvironment out;
  out.python = (env / "bin" / "python").string();
  std::error_code ec;
  if (fs::exists(env / kReadyMark, ec)) return out;  // made before, for this very file, folder and interpreter

  fs::create_directories(root, ec);
  if (ec) refuse(spec, "cannot make " + root.string() + ": " + ec.message());
  // One maker at a time, in place (a venv's scripts name its folder), the mark written
  // last: a host that finds the mark finds the whole environment.
  const std::string lock_path = env.string() + ".lock";
  const int lock = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock < 0) refuse(spec, "cannot open " + lock_path + ": " + std::strerror(errno));
  struct Unlock {
    int fd;
    ~Unlock() { ::close(fd); }  // (closing releases the lock)
  } unlock{lock};
  while (::flock(lock, LOCK_EX) != 0) {
    if (errno != EINTR) refuse(spec, "cannot lock " + lock_path + ": " + std::strerror(errno));
  }
  if (fs::exists(env / kReadyMark, ec)) return out;  // made by another host while this one waited
  struct Unmade {                                    // what a maker that failed (or died) left is removed
    fs::path path;
    bool made = false;
    ~Unmade() {
      std::error_code ignored;
      if (!made) fs::remove_all(path, ignored);
    }
  } unmade{env};
  fs::remove_all(env, ec);
  const fs::path pip_tmp = env / ".pip-tmp";

  ChildSpec venv;
  venv.executable = spec.base_python;
  venv.argv = {spec.base_python, "-I", "-m", "venv", env.string()};
  venv.env = {"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "LC_ALL=C.UTF-8"};
  if (const ChildOutcome made = run_step(spec, venv, 120'000, "python -m venv");
      made.ended != ChildOutcome::Ended::exited || made.exit_code != 0) {
    refuse(spec, "the environment could not be made: " + spec.base_python + " -m venv " + made.how + ": " +
                     trimmed(made.tail));
  }
  fs::create_directories(pip_tmp, ec);

  sandbox::ExecSpec walls;
  walls.restrict_read = true;
  walls.read_paths = base.paths;
  for (const char* path : kInstallReadPaths) walls.read_paths.emplace_back(path);
  walls.read_paths.push_back(spec.skill_dir);
  walls.restrict_write = true;
  walls.write_paths = {env.string()};
  if (const char* key = std::getenv("MACHINA_LEASE_KEY_FILE"); key != nullptr && *key != '\0') {
    walls.hidden_files.emplace_back(key);
  }
  // pip installs the text read above, from a copy of it in the skill's folder's stead.
  const fs::path hashed = pip_tmp / kSkillRequirementsFile;
  if (!(std::ofstream(hashed, std::ios::binary) << text)) refuse(spec, "cannot write " + hashed.string());
  ChildSpec pip;
  pip.executable = spec.sandbox_executable;
  pip.argv = {spec.sandbox_executable, "--sandbox-exec", walls.to_json(), "--", out.python, "-I", "-m", "pip"};
  pip.argv.insert(pip.argv.end(), std::begin(kPipInstallArgs), std::end(kPipInstallArgs));
  pip.argv.insert(pip.argv.end(), {"-r", hashed.string()});
  pip.env = pip_environment(pip_tmp.string());
  pip.cwd = spec.skill_dir;  // (a requirement may name a file of the skill's)
  const ChildOutcome installed = run_step(spec, pip, spec.timeout_ms, "pip");
  if (installed.ended != ChildOutcome::Ended::exited || installed.exit_code != 0) {
    const std::string tail = trimmed(installed.tail);
    if (installed.exit_code == 126 && tail.find("machina-toolhost sandbox") != std::string::npos) {
      refuse(spec, "pip could not be confined: " + tail);
    }
    if (installed.ended == ChildOutcome::Ended::output_over_cap)
      refuse(spec, "pip wrote more than " + std::to_string(kMaxStepOutputBytes >> 20) + " MiB");
    refuse(spec, "pip " + installed.how + (tail.empty() ? "" : ": " + tail));
  }
  fs::remove_all(pip_tmp, ec);
  if (!(std::ofstream(env / kReadyMark, std::ios::binary) << text)) {
    refuse(spec, "cannot write " + (env / kReadyMark).string());
  }
  unmade.made = true;
  out.made = true;
  return out;
}

}  // namespace machina
