/* Plain-C plugins for the loader tests: one source, one variant per macro. The good
 * variant (GOOD_C_PLUGIN) shows the ABI is usable from C alone. */
#include <machina/plugin_abi.h>

#include <string.h>

#ifndef BROKEN_NO_REGISTER
static int c_upper(void* data, const machina_host_api* api, machina_call* call, const char* input, size_t len) {
  (void)data;
  char buf[256];
  if (len >= sizeof buf) {
    api->set_error(call, "input too long", 14);
    return MACHINA_TOOL_ERROR;
  }
  for (size_t i = 0; i < len; ++i) {
    char c = input[i];
    buf[i] = (c >= 'a' && c <= 'z') ? (char)(c - 32) : c;
  }
  return api->set_output(call, buf, len) == 0 ? MACHINA_TOOL_OK : MACHINA_TOOL_ERROR;
}
#endif

#ifndef BROKEN_NO_VERSION
MACHINA_PLUGIN_EXPORT uint32_t machina_plugin_abi_version(void) {
#ifdef BROKEN_WRONG_VERSION
  return MACHINA_PLUGIN_ABI_VERSION + 98u;
#else
  return MACHINA_PLUGIN_ABI_VERSION;
#endif
}
#endif

#ifndef BROKEN_NO_REGISTER
MACHINA_PLUGIN_EXPORT int machina_plugin_register(const machina_registrar_api* api, machina_registrar* reg) {
  machina_tool_desc d;
  memset(&d, 0, sizeof d);
  d.struct_size = sizeof d;
  d.invoke = c_upper;
#if defined(BROKEN_DUPLICATE_ECHO)
  d.aid = "AID.ECHO.v1";
#elif defined(BROKEN_BAD_TIER)
  d.aid = "AID.TEST.BADTIER.v1";
  d.tier = 7;
#elif defined(BROKEN_BAD_SCHEMA)
  d.aid = "AID.TEST.BADSCHEMA.v1";
  d.input_schema = "{\"type\":\"string\",\"pattern\":\"^a\"}";
#else
  d.aid = "AID.C.UPPER.v1";
  d.name = "c_upper";
  d.description = "Upper-cases the ASCII letters of its input (a C plugin).";
  d.deterministic = 1;
#endif
  return api->add_tool(reg, &d);
}
#endif
