// Header-only C++ layer over plugin_abi.h for plugin authors: declare tools as
// lambdas; exceptions are caught here and reported as MACHINA_TOOL_FAULT so that none
// ever crosses into the host.
#pragma once

#include <machina/plugin_abi.h>

#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace machina::plugin {

/// A ds_state artifact as seen by a tool. Views returned by Call::slot() point into
/// host memory and stay valid until the call ends or the slot changes.
struct Artifact {
  std::string_view type;
  std::string_view content_json;
  std::string_view provenance;
  std::uint64_t size_bytes = 0;
};

enum class Result { ok = MACHINA_TOOL_OK, error = MACHINA_TOOL_ERROR, fault = MACHINA_TOOL_FAULT };

/// One tool invocation: the input and the host services for this call.
class Call {
 public:
  Call(const machina_host_api* api, machina_call* call, std::string_view input)
      : api_(api), call_(call), input_(input) {}

  /// The tool's input: JSON text that already passed the declared schema.
  std::string_view input() const { return input_; }

  /// Sets the output JSON; false if it exceeds the host's output cap.
  bool output(std::string_view json) { return api_->set_output(call_, json.data(), json.size()) == 0; }

  /// Sets the error message and returns Result::error, for `return call.fail("...")`.
  Result fail(std::string_view message) {
    api_->set_error(call_, message.data(), message.size());
    return Result::error;
  }

  std::optional<Artifact> slot(std::uint32_t index) const {
    machina_artifact a{};
    if (api_->slot_get(call_, index, &a) != 1) return std::nullopt;
    return Artifact{
        {a.type, a.type_len}, {a.content_json, a.content_json_len}, {a.provenance, a.provenance_len}, a.size_bytes};
  }

  bool set_slot(std::uint32_t index, const Artifact& artifact) {
    machina_artifact a{artifact.type.data(),         artifact.type.size(),       artifact.content_json.data(),
                       artifact.content_json.size(), artifact.provenance.data(), artifact.provenance.size(),
                       artifact.size_bytes};
    return api_->slot_set(call_, index, &a) == 0;
  }

  bool clear_slot(std::uint32_t index) { return api_->slot_clear(call_, index) == 0; }

 private:
  const machina_host_api* api_;
  machina_call* call_;
  std::string_view input_;
};

/// What a tool declares (see machina_tool_desc); filled with chained setters:
///   registry.tool("AID.X.v1", fn).name("x").description("...").deterministic().tier(0);
class ToolSpec {
 public:
  ToolSpec(std::string aid, std::function<Result(Call&)> run) : aid_(std::move(aid)), run_(std::move(run)) {}

  ToolSpec& name(std::string v) {
    name_ = std::move(v);
    return *this;
  }
  ToolSpec& description(std::string v) {
    description_ = std::move(v);
    return *this;
  }
  /// JSON Schema for the input (the subset the host supports, see docs/plugins.md).
  ToolSpec& input_schema(std::string v) {
    input_schema_ = std::move(v);
    return *this;
  }
  ToolSpec& deterministic(bool v = true) {
    deterministic_ = v;
    return *this;
  }
  ToolSpec& tags(std::vector<std::string> v) {
    tags_ = std::move(v);
    return *this;
  }
  ToolSpec& side_effects(std::vector<std::string> v) {
    side_effects_ = std::move(v);
    return *this;
  }
  ToolSpec& replay_inputs(bool v = true) {
    replay_inputs_ = v;
    return *this;
  }
  /// Lease tier: MACHINA_TIER_SAFE (0) .. MACHINA_TIER_DANGEROUS (3).
  ToolSpec& tier(int v) {
    tier_ = v;
    return *this;
  }
  /// The tool's own deadline per call in milliseconds (0: the host's default). A
  /// request's timeout_ms and the host's ceiling still apply.
  ToolSpec& timeout_ms(std::uint32_t v) {
    timeout_ms_ = v;
    return *this;
  }

 private:
  friend class Registry;
  std::string aid_, name_, description_, input_schema_;
  bool deterministic_ = false;
  std::vector<std::string> tags_, side_effects_;
  bool replay_inputs_ = false;
  int tier_ = MACHINA_TIER_SAFE;
  std::uint32_t timeout_ms_ = 0;
  std::function<Result(Call&)> run_;
};

/// Collects the plugin's tools; filled once by the function given to MACHINA_PLUGIN.
class Registry {
 public:
  /// Declares a tool; the returned spec stays valid (and settable) while filling.
  ToolSpec& tool(std::string aid, std::function<Result(Call&)> run) {
    return specs_.emplace_back(std::move(aid), std::move(run));
  }

  /// Hands every tool to the host. The descriptions point into this registry, which
  /// lives as long as the library stays loaded.
  int register_with(const machina_registrar_api* api, machina_registrar* registrar) {
    for (Entry& e : entries_) {
      if (api->add_tool(registrar, &e.desc) != 0) return -1;
    }
    return 0;
  }

  void finalize() {
    for (ToolSpec& spec : specs_) entries_.emplace_back(spec);
  }

 private:
  struct Entry {
    explicit Entry(ToolSpec& s) {
      for (auto& t : s.tags_) tag_ptrs.push_back(t.c_str());
      for (auto& t : s.side_effects_) effect_ptrs.push_back(t.c_str());
      desc.struct_size = sizeof(machina_tool_desc);
      desc.aid = s.aid_.c_str();
      desc.name = s.name_.empty() ? s.aid_.c_str() : s.name_.c_str();
      desc.description = s.description_.c_str();
      desc.input_schema = s.input_schema_.empty() ? nullptr : s.input_schema_.c_str();
      desc.deterministic = s.deterministic_ ? 1 : 0;
      desc.tags = tag_ptrs.data();
      desc.tag_count = tag_ptrs.size();
      desc.side_effects = effect_ptrs.data();
      desc.side_effect_count = effect_ptrs.size();
      desc.replay_inputs = s.replay_inputs_ ? 1 : 0;
      desc.tier = s.tier_;
      desc.invoke = s.run_ ? &Entry::trampoline : nullptr;
      desc.tool_data = &s.run_;
      desc.default_timeout_ms = s.timeout_ms_;
    }

    static int trampoline(void* data, const machina_host_api* api, machina_call* call, const char* input,
                          std::size_t len) noexcept {
      Call c(api, call, std::string_view(input, len));
      try {
        auto& fn = *static_cast<std::function<Result(Call&)>*>(data);
        return static_cast<int>(fn(c));
      } catch (const std::exception& e) {
        std::string msg = std::string("tool raised: ") + e.what();
        api->set_error(call, msg.data(), msg.size());
      } catch (...) {
        static constexpr std::string_view msg = "tool raised a non-standard exception";
        api->set_error(call, msg.data(), msg.size());
      }
      return MACHINA_TOOL_FAULT;
    }

    std::vector<const char*> tag_ptrs;
    std::vector<const char*> effect_ptrs;
    machina_tool_desc desc{};
  };

  std::deque<ToolSpec> specs_;  // deque: references stay valid as tools are added
  std::deque<Entry> entries_;
};

namespace detail {
inline int register_once(void (*fill)(Registry&), const machina_registrar_api* api,
                         machina_registrar* registrar) noexcept {
  static Registry registry;
  static std::once_flag once;
  try {
    std::call_once(once, [&] {
      fill(registry);
      registry.finalize();
    });
    return registry.register_with(api, registrar);
  } catch (const std::exception& e) {
    api->fail(registrar, e.what());
  } catch (...) {
    api->fail(registrar, "plugin registration raised a non-standard exception");
  }
  return -1;
}
}  // namespace detail

}  // namespace machina::plugin

/// Defines the plugin's two C entry points around `void fill(machina::plugin::Registry&)`.
#define MACHINA_PLUGIN(fill)                                                                     \
  extern "C" MACHINA_PLUGIN_EXPORT std::uint32_t machina_plugin_abi_version(void) {              \
    return MACHINA_PLUGIN_ABI_VERSION;                                                           \
  }                                                                                              \
  extern "C" MACHINA_PLUGIN_EXPORT int machina_plugin_register(const machina_registrar_api* api, \
                                                               machina_registrar* registrar) {   \
    return ::machina::plugin::detail::register_once(&(fill), api, registrar);                    \
  }
