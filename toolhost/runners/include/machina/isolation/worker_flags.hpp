// The command line of an isolated worker (`EXE --isolation-worker ...`): the flags the host
// writes when it starts one (ProcessRunner) and machina-toolhost's worker side reads
// (toolhost/cli/worker_main.cpp). The host options among them are checked against the
// option table (host_options.def) where both are known.
#pragma once

#include <string_view>

namespace machina::worker_flags {

inline constexpr std::string_view kWorker = "--isolation-worker";   // run as a worker
inline constexpr std::string_view kParentPid = "--parent-pid";      // the host's pid (the worker ends with it)
inline constexpr std::string_view kSpares = "--isolation-spares";   // call processes kept ready
inline constexpr std::string_view kLinkedTools = "--linked-tools";  // register the tools linked into the program
inline constexpr std::string_view kHide = "--isolation-hide";       // a file covered inside the sandbox
inline constexpr std::string_view kPlugin = "--plugin";             // a plugin library to load
// Host options the worker enforces too.
inline constexpr std::string_view kMaxOutputBytes = "--max-output-bytes";
inline constexpr std::string_view kMaxRequestBytes = "--max-request-bytes";
inline constexpr std::string_view kLimitCpuS = "--limit-cpu-s";
inline constexpr std::string_view kLimitMemoryMb = "--limit-memory-mb";
inline constexpr std::string_view kLimitOpenFiles = "--limit-open-files";
inline constexpr std::string_view kLimitFileSizeMb = "--limit-file-size-mb";
inline constexpr std::string_view kNoNetwork = "--no-network";

}  // namespace machina::worker_flags
