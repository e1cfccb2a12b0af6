// The worker side of --isolation process.
#include "worker_main.hpp"

#include "invocation.hpp"

#include <machina/host_options_table.hpp>
#include <machina/isolation/worker.hpp>
#include <machina/isolation/worker_flags.hpp>

namespace machina::cli {

namespace {

// The host options a worker is started with are spelt as the option table spells them.
constexpr bool table_flag_is(std::string_view name, std::string_view worker_flag) {
  const HostOptionInfo* row = find_host_option(name);
  return row != nullptr && worker_flag.substr(0, 2) == "--" && row->flag == worker_flag.substr(2);
}
static_assert(table_flag_is("max_output_bytes", worker_flags::kMaxOutputBytes));
static_assert(table_flag_is("max_request_bytes", worker_flags::kMaxRequestBytes));
static_assert(table_flag_is("limit_cpu_s", worker_flags::kLimitCpuS));
static_assert(table_flag_is("limit_memory_mb", worker_flags::kLimitMemoryMb));
static_assert(table_flag_is("limit_open_files", worker_flags::kLimitOpenFiles));
static_assert(table_flag_is("limit_file_size_mb", worker_flags::kLimitFileSizeMb));
static_assert(table_flag_is("no_network", worker_flags::kNoNetwork));

}  // namespace

void WorkerFlags::add(CLI::App& app) {
  app.add_flag(std::string(worker_flags::kWorker), worker_mode)->group("");
  app.add_flag(std::string(worker_flags::kLinkedTools), with_linked_tools)->group("");
  app.add_option(std::string(worker_flags::kParentPid), parent_pid)->group("");
  app.add_option(std::string(worker_flags::kSpares), spares)
      ->check(CLI::Range(std::size_t{1}, std::size_t{64}))
      ->group("");
  app.add_option(std::string(worker_flags::kHide), hidden_files)->group("");
}

int WorkerFlags::run(const std::vector<std::string>& plugins, const HostOptions& options) const {
  worker::WorkerConfig wc;
  wc.load_tools = [&](ToolRegistry& registry) {
#ifdef MACHINA_LINKED_TOOLS
    (void)plugins;  // (with plugins named, main has handed over to the plugin loader)
    if (with_linked_tools) registry.add_plugin(std::string(kLinkedPluginSource), linked_tools(), nullptr);
#else
    if (with_linked_tools) throw ConfigError("--linked-tools: this build of machina-toolhost has no linked tools");
    for (const auto& p : plugins) registry.load_plugin(p, nullptr);
#endif
  };
  const WorkerLimits& limits = options.workers.limits;
  wc.limits = limits;
  wc.walls.own_network = limits.no_network;
  wc.walls.hidden_files = hidden_files;
  wc.spares = spares;
  wc.max_output_bytes = options.max_output_bytes;
  wc.max_frame_bytes = 10 * options.max_request_bytes + (1u << 20);
  wc.parent_pid = parent_pid;
  return worker::run_worker(wc);
}

}  // namespace machina::cli
