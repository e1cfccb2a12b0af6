// What pip reads besides the interpreters' own files when it installs within walls
// (install_python_package, a skill's requirements.txt).
#pragma once

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

}  // namespace machina
