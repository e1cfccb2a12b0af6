// Two linked tools for the unit tests of the fronts: AID.UNIT.ECHO.v1 and AID.UNIT.OTHER.v1,
// each answering its input as its output.
#pragma once

#include <machina/plugin_abi.h>
#include <machina/tool_host.hpp>

#include <cstddef>
#include <cstdint>

namespace machina::test {

inline std::uint32_t echo_abi() {
  return MACHINA_PLUGIN_ABI_VERSION;
}

inline int echo_input(void*, const machina_host_api* api, machina_call* call, const char* input,
                      std::size_t len) noexcept {
  return api->set_output(call, input, len) == 0 ? MACHINA_TOOL_OK : MACHINA_TOOL_FAULT;
}

inline int register_echo_tools(const machina_registrar_api* api, machina_registrar* registrar) {
  for (const char* aid : {"AID.UNIT.ECHO.v1", "AID.UNIT.OTHER.v1"}) {
    machina_tool_desc d{};
    d.struct_size = sizeof d;
    d.aid = aid;
    d.name = "echo";
    d.description = "echoes its input";
    d.invoke = &echo_input;
    if (api->add_tool(registrar, &d) != 0) return 1;
  }
  return 0;
}

/// The two tools, to hand to ToolHost::add_linked_plugin.
inline PluginEntryPoints echo_tools() {
  return PluginEntryPoints{&echo_abi, &register_echo_tools};
}

}  // namespace machina::test
