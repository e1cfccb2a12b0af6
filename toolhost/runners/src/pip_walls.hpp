// What the installers that run pip within walls (install_python_package, a skill's
// requirements.txt) give it alike: the paths it reads besides the interpreters' own files,
// the flags of a quiet, non-interactive install, and its environment.
#pragma once

#include <machina/child_process.hpp>

#include <string>
#include <vector>

namespace machina {

// What pip reads besides the interpreters' own files: the system libraries, the name
// service, certificates, and what its platform probes open without expecting a refusal.
inline constexpr const char* kInstallReadPaths[] = {"/lib",
                                                    "/lib64",
                                                    "/usr/lib",
                                                    "/usr/lib64",
                                                    "/usr/local/lib",
                                                    "/etc/ld.so.cache",
                                                    "/etc/localtime",
                                                    "/etc/ssl",
                                                    "/etc/pki",
                                                    "/etc/ca-certificates",
                                                    "/usr/share/ca-certificates",
                                                    "/etc/resolv.conf",
                                                    "/etc/hosts",
                                                    "/etc/nsswitch.conf",
                                                    "/etc/gai.conf",
                                                    "/etc/host.conf",
                                                    "/etc/services",
                                                    "/etc/protocols",
                                                    "/etc/os-release",
                                                    "/etc/debian_version",
                                                    "/etc/mime.types",
                                                    "/etc/passwd",
                                                    "/etc/group"};

/// `pip install` without questions, cache, progress or warnings about scripts.
inline constexpr const char* kPipInstallArgs[] = {"install",
                                                  "--no-input",
                                                  "--disable-pip-version-check",
                                                  "--no-cache-dir",
                                                  "--no-warn-script-location",
                                                  "--progress-bar",
                                                  "off",
                                                  "--quiet"};

/// pip's environment: the proxy and certificate variables of the host's, a fixed PATH and
/// locale, no configuration file or user site, and `home` as its home and temporary folder.
inline std::vector<std::string> pip_environment(const std::string& home) {
  std::vector<std::string> env = pick_environment({"http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY",
                                                   "NO_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE"});
  env.insert(env.end(), {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + home, "TMPDIR=" + home, "LANG=C.UTF-8",
                         "LC_ALL=C.UTF-8", "PIP_CONFIG_FILE=/dev/null", "PYTHONNOUSERSITE=1"});
  return env;
}

}  // namespace machina
