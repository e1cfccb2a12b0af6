/* machina-toolhost plugin ABI: the C contract between the host and a tool plugin.
 *
 * Only C types cross this boundary. The host owns every buffer it hands to a plugin
 * (valid for the duration of the call that received it) and copies everything a
 * plugin hands back, so no allocator, exception or C++ type is ever shared.
 *
 * A plugin is a shared library exporting two functions:
 *   uint32_t machina_plugin_abi_version(void);           checked before anything else
 *   int      machina_plugin_register(const machina_registrar_api*, machina_registrar*);
 * The host refuses a plugin whose version differs from MACHINA_PLUGIN_ABI_VERSION,
 * one that lacks either entry point, and one that declares an aid already registered.
 */
#ifndef MACHINA_PLUGIN_ABI_H
#define MACHINA_PLUGIN_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MACHINA_PLUGIN_ABI_VERSION 1u

#if defined(_WIN32)
#define MACHINA_PLUGIN_EXPORT __declspec(dllexport)
#else
#define MACHINA_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

/* Number of ds_state slots (DS0 ... DS7). */
#define MACHINA_DS_SLOTS 8u

/* What a tool's invoke function returns. */
typedef enum machina_tool_result {
  MACHINA_TOOL_OK = 0,    /* output set with set_output */
  MACHINA_TOOL_ERROR = 1, /* the tool refused or failed; message set with set_error */
  MACHINA_TOOL_FAULT = 2  /* the tool itself broke (e.g. an exception was caught);
                             counts against the tool's circuit breaker */
} machina_tool_result;

/* Lease tiers: what a tool may do, and so whether it needs a lease when enforced. */
typedef enum machina_tier {
  MACHINA_TIER_SAFE = 0,
  MACHINA_TIER_WRITE = 1,
  MACHINA_TIER_SYSTEM = 2,
  MACHINA_TIER_DANGEROUS = 3
} machina_tier;

/* One ds_state artifact. Strings are UTF-8, not NUL-terminated (use the lengths). */
typedef struct machina_artifact {
  const char* type;
  size_t type_len;
  const char* content_json; /* JSON text */
  size_t content_json_len;
  const char* provenance;
  size_t provenance_len;
  uint64_t size_bytes;
} machina_artifact;

/* Opaque per-call context owned by the host. */
typedef struct machina_call machina_call;

/* Services the host offers a running tool. Every function is safe to call only from
 * the thread that runs the tool, and only during that call. */
typedef struct machina_host_api {
  uint32_t abi_version; /* == MACHINA_PLUGIN_ABI_VERSION */
  uint32_t struct_size; /* sizeof(machina_host_api) as the host knows it */

  /* Sets the tool's output (JSON text, copied). Returns 0, or -1 if it exceeds the
   * host's output cap (the call then fails with output_too_large). */
  int (*set_output)(machina_call* call, const char* json, size_t len);
  /* Sets the human-readable error for MACHINA_TOOL_ERROR / MACHINA_TOOL_FAULT (copied). */
  void (*set_error)(machina_call* call, const char* message, size_t len);

  /* Reads slot `slot` (0..7). Returns 1 and fills *out (borrowed, valid until the
   * call ends or the slot is changed) if set, 0 if empty, -1 if slot is out of range. */
  int (*slot_get)(machina_call* call, uint32_t slot, machina_artifact* out);
  /* Sets slot `slot` (copied). Returns 0, or -1 if slot is out of range, the
   * artifact's content_json is not JSON or larger than the host's output cap, or its
   * type or provenance is not UTF-8. */
  int (*slot_set)(machina_call* call, uint32_t slot, const machina_artifact* artifact);
  /* Empties slot `slot`. Returns 0, or -1 if out of range. */
  int (*slot_clear)(machina_call* call, uint32_t slot);
} machina_host_api;

/* A tool's entry point. `input_json` (host-owned, NUL-terminated, valid JSON that
 * already passed the declared schema) lives until the function returns. */
typedef int (*machina_tool_fn)(void* tool_data, const machina_host_api* api, machina_call* call, const char* input_json,
                               size_t input_len);

/* What a plugin declares per tool. All strings are NUL-terminated and are copied at
 * registration. Fields after struct_size may grow in later ABI versions. */
typedef struct machina_tool_desc {
  uint32_t struct_size; /* sizeof(machina_tool_desc) */
  const char* aid;      /* unique action id, e.g. "AID.ECHO.v1" */
  const char* name;
  const char* description;
  const char* input_schema; /* JSON Schema (subset, see docs) or NULL */
  int deterministic;        /* same input -> same output, no hidden state */
  const char* const* tags;
  size_t tag_count;
  const char* const* side_effects; /* e.g. "fs_write", "network"; none for pure tools */
  size_t side_effect_count;
  int replay_inputs; /* the call can be replayed from its recorded inputs alone */
  int tier;          /* machina_tier, 0..3 */
  machina_tool_fn invoke;
  void* tool_data; /* passed back to invoke */
  /* Read only if struct_size covers it: a description may end before this field. */
  uint32_t default_timeout_ms; /* the tool's own deadline per call; 0: the host's default */
} machina_tool_desc;

/* The smallest machina_tool_desc the host accepts: the fields up to tool_data. It reads a
 * later field only when struct_size says the description holds it. */
#define MACHINA_TOOL_DESC_MIN_SIZE (offsetof(machina_tool_desc, tool_data) + sizeof(void*))

typedef struct machina_registrar machina_registrar;

/* What the host offers a plugin at registration. */
typedef struct machina_registrar_api {
  uint32_t abi_version;
  uint32_t struct_size;
  /* Declares a tool. Returns 0, or -1 if the description is refused (the host then
   * refuses the whole plugin, naming the reason). */
  int (*add_tool)(machina_registrar* registrar, const machina_tool_desc* desc);
  /* Reports why registration failed (copied); return non-zero from register after it. */
  void (*fail)(machina_registrar* registrar, const char* message);
} machina_registrar_api;

typedef uint32_t (*machina_plugin_abi_version_fn)(void);
typedef int (*machina_plugin_register_fn)(const machina_registrar_api* api, machina_registrar* registrar);

#define MACHINA_PLUGIN_ABI_VERSION_SYMBOL "machina_plugin_abi_version"
#define MACHINA_PLUGIN_REGISTER_SYMBOL "machina_plugin_register"

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MACHINA_PLUGIN_ABI_H */
