/* Tools for the benchmarks, written against the C ABI alone:
 *   AID.BENCH.SLEEP.v1        sleeps 1 ms (or {"ms": N}) and answers {"slept_ms": N};
 *   AID.BENCH.T<i>.v1         echo tools, as many as MACHINA_BENCH_TOOLS says (default 1),
 *                             for measuring the cost of a large registry. */
#define _GNU_SOURCE
#include <machina/plugin_abi.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int sleep_tool(void* data, const machina_host_api* api, machina_call* call, const char* input, size_t len) {
  (void)data;
  (void)len;
  long ms = 1;
  const char* p = strstr(input, "\"ms\"");
  if (p && (p = strchr(p, ':'))) ms = strtol(p + 1, NULL, 10);
  if (ms < 0 || ms > 10000) {
    api->set_error(call, "ms must be 0..10000", 19);
    return MACHINA_TOOL_ERROR;
  }
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
  char out[48];
  int n = snprintf(out, sizeof out, "{\"slept_ms\":%ld}", ms);
  return api->set_output(call, out, (size_t)n) == 0 ? MACHINA_TOOL_OK : MACHINA_TOOL_ERROR;
}

static int echo_tool(void* data, const machina_host_api* api, machina_call* call, const char* input, size_t len) {
  (void)data;
  return api->set_output(call, input, len) == 0 ? MACHINA_TOOL_OK : MACHINA_TOOL_ERROR;
}

MACHINA_PLUGIN_EXPORT uint32_t machina_plugin_abi_version(void) {
  return MACHINA_PLUGIN_ABI_VERSION;
}

MACHINA_PLUGIN_EXPORT int machina_plugin_register(const machina_registrar_api* api, machina_registrar* reg) {
  machina_tool_desc d;
  memset(&d, 0, sizeof d);
  d.struct_size = sizeof d;
  d.aid = "AID.BENCH.SLEEP.v1";
  d.name = "bench_sleep";
  d.description = "Sleeps 1 ms, or {\"ms\": N}.";
  d.invoke = sleep_tool;
  if (api->add_tool(reg, &d) != 0) return -1;

  const char* env = getenv("MACHINA_BENCH_TOOLS");
  long count = env ? strtol(env, NULL, 10) : 1;
  if (count < 1 || count > 1000000) count = 1;
  for (long i = 0; i < count; ++i) {
    char aid[40];
    snprintf(aid, sizeof aid, "AID.BENCH.T%ld.v1", i);
    d.aid = aid; /* copied by the host at registration */
    d.name = aid;
    d.description = "Returns its input unchanged.";
    d.deterministic = 1;
    d.invoke = echo_tool;
    if (api->add_tool(reg, &d) != 0) return -1;
  }
  return 0;
}
