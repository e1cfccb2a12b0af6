// Loading plugin libraries with dlopen. Kept apart from registration so that the
// statically linked machina-toolhost, whose tools are linked in, contains no dynamic
// loading at all (a static program cannot safely dlopen code that needs the C library).
#include <machina/errors.hpp>
#include <machina/tool_host.hpp>
#include <machina/tool_registry.hpp>

#include <dlfcn.h>

#include <mutex>

namespace machina {

std::vector<std::string> ToolRegistry::load_plugin(const std::string& path, Runner* runner) {
  const std::string where = "plugin " + path + ": ";
  std::unique_ptr<void, int (*)(void*)> lib(dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL), &dlclose);
  if (lib == nullptr) {
    const char* why = dlerror();
    throw ConfigError(where + "cannot load: " + (why ? why : "unknown error"));
  }
  // Loaded, the library stays until the registry goes, even when it is refused: code it
  // ran while loading (a thread it started) may still be running in it, and unloading
  // would pull that code from under it.
  void* const handle = lib.get();
  {
    std::unique_lock lock(mu_);
    libraries_.push_back(std::move(lib));
  }
  PluginEntryPoints entry;
  entry.abi_version = reinterpret_cast<machina_plugin_abi_version_fn>(dlsym(handle, MACHINA_PLUGIN_ABI_VERSION_SYMBOL));
  if (entry.abi_version == nullptr) throw ConfigError(where + "missing entry point " MACHINA_PLUGIN_ABI_VERSION_SYMBOL);
  entry.register_tools = reinterpret_cast<machina_plugin_register_fn>(dlsym(handle, MACHINA_PLUGIN_REGISTER_SYMBOL));
  return add_plugin(path, entry, runner);
}

std::vector<std::string> ToolHost::load_plugin(const std::string& path) {
  // An isolated plugin is loaded in a sandboxed worker, never here.
  ToolRegistry& registry = host_.registry_to_fill();
  if (process_) return registry.add_described(path, process_->describe(path), process_.get());
  return registry.load_plugin(path, &inline_);
}

}  // namespace machina
