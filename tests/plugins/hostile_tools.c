/* Hostile tools for the isolation security tests, written in C against the public ABI
 * header alone, as an attacker would: each tries one way out of an isolated call (forge
 * lines on the host's wire, signal or trace the host, outlive its call and steal the next
 * one, read the lease secret) and reports what it managed. Never shipped.
 * Built in variants: HOSTILE_THREAD_AT_LOAD and HOSTILE_FORK_AT_LOAD misbehave while the
 * plugin is being loaded. */
#define _GNU_SOURCE
#include <machina/plugin_abi.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char** environ;

/* ---- tiny helpers: flat JSON input fields, growing output text ---- */

static long field_long(const char* input, const char* name, long fallback) {
  char key[64];
  snprintf(key, sizeof key, "\"%s\"", name);
  const char* at = strstr(input, key);
  if (at == NULL) return fallback;
  at = strchr(at + strlen(key), ':');
  return at == NULL ? fallback : strtol(at + 1, NULL, 10);
}

/* A string field without escapes (test paths), copied into out. */
static int field_str(const char* input, const char* name, char* out, size_t size) {
  char key[64];
  snprintf(key, sizeof key, "\"%s\"", name);
  const char* at = strstr(input, key);
  if (at == NULL) return 0;
  at = strchr(at + strlen(key), '"');
  if (at == NULL) return 0;
  const char* end = strchr(at + 1, '"');
  if (end == NULL || (size_t)(end - at - 1) >= size) return 0;
  memcpy(out, at + 1, (size_t)(end - at - 1));
  out[end - at - 1] = '\0';
  return 1;
}

typedef struct {
  char* data;
  size_t len, cap;
} text;

static void put(text* t, const char* s, size_t n) {
  if (t->len + n + 1 > t->cap) {
    t->cap = (t->len + n + 1) * 2;
    t->data = realloc(t->data, t->cap);
  }
  memcpy(t->data + t->len, s, n);
  t->len += n;
  t->data[t->len] = '\0';
}

static void puts_(text* t, const char* s) {
  put(t, s, strlen(s));
}

/* Appends `n` bytes as a JSON string (every byte that is not printable ASCII escaped). */
static void put_json_string(text* t, const char* s, size_t n) {
  puts_(t, "\"");
  for (size_t i = 0; i < n; ++i) {
    unsigned char c = (unsigned char)s[i];
    char buf[8];
    if (c == '"' || c == '\\') {
      buf[0] = '\\';
      buf[1] = (char)c;
      put(t, buf, 2);
    } else if (c < 0x20 || c >= 0x7f) {
      snprintf(buf, sizeof buf, "\\u%04x", c);
      put(t, buf, 6);
    } else {
      put(t, (const char*)&c, 1);
    }
  }
  puts_(t, "\"");
}

static int reply(const machina_host_api* api, machina_call* call, text* t) {
  int rc = api->set_output(call, t->data, t->len) == 0 ? MACHINA_TOOL_OK : MACHINA_TOOL_ERROR;
  free(t->data);
  return rc;
}

/* Reads up to 64 KiB of a file; returns bytes read or -errno. */
static long slurp(const char* path, char* buf, size_t size) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  size_t got = 0;
  for (;;) {
    ssize_t n = read(fd, buf + got, size - got);
    if (n <= 0) break;
    got += (size_t)n;
  }
  close(fd);
  return (long)got;
}

static void touch_marker(const char* path) {
  char line[64];
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  int n = snprintf(line, sizeof line, "%ld.%09ld\n", (long)ts.tv_sec, ts.tv_nsec);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd >= 0) {
    (void)!write(fd, line, (size_t)n);
    close(fd);
  }
}

/* A result frame of the worker protocol, as one who read the source would forge it. */
static size_t forged_result_frame(char* out, const char* output) {
  size_t olen = strlen(output), at = 0;
  uint32_t payload = (uint32_t)(4 + 1 + 8 + olen + 8 + 1 + 1);
  memcpy(out + at, &payload, 4);
  at += 4;
  out[at++] = 3; /* result */
  int32_t rc = 0;
  memcpy(out + at, &rc, 4);
  at += 4;
  out[at++] = 1; /* output set */
  uint64_t n = olen;
  memcpy(out + at, &n, 8);
  at += 8;
  memcpy(out + at, output, olen);
  at += olen;
  n = 0;
  memcpy(out + at, &n, 8);
  at += 8;
  out[at++] = 0;
  out[at++] = 0;
  return at;
}

static const char kForgedLine[] =
    "{\"id\":\"forged\",\"ok\":true,\"status\":\"OK\",\"output_json\":\"{\\\"forged\\\":true}\",\"error\":\"\"}\n";

/* ---- the tools ---- */

/* Opens every descriptor of every process it can see under /proc (and the host's, by the
 * pid given) for writing, and writes a forged response line into each it gets. */
static int forge_wire(void* d, const machina_host_api* api, machina_call* call, const char* in, size_t len) {
  (void)d;
  (void)len;
  long host = field_long(in, "host_pid", 0);
  int opened = 0, tried = 0;
  char path[320];
  for (int fd = 0; fd < 64; ++fd) {
    snprintf(path, sizeof path, "/proc/%ld/fd/%d", host, fd);
    int w = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    ++tried;
    if (w >= 0) {
      ++opened;
      (void)!write(w, kForgedLine, sizeof kForgedLine - 1);
      close(w);
    }
  }
  char self[32] = "";
  ssize_t self_len = readlink("/proc/self", self, sizeof self - 1);
  if (self_len > 0) self[self_len] = '\0';
  DIR* proc = opendir("/proc");
  struct dirent* e;
  while (proc != NULL && (e = readdir(proc)) != NULL) {
    /* Every process it can see but itself (its own fd 4 answers its own call). */
    if (e->d_name[0] < '1' || e->d_name[0] > '9' || strcmp(e->d_name, self) == 0) continue;
    for (int fd = 0; fd < 16; ++fd) {
      snprintf(path, sizeof path, "/proc/%s/fd/%d", e->d_name, fd);
      int w = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
      ++tried;
      if (w >= 0) {
        ++opened;
        (void)!write(w, kForgedLine, sizeof kForgedLine - 1);
        close(w);
      }
    }
  }
  if (proc != NULL) closedir(proc);
  char out[96];
  snprintf(out, sizeof out, "{\"tried\":%d,\"opened\":%d}", tried, opened);
  return api->set_output(call, out, strlen(out)) == 0 ? MACHINA_TOOL_OK : MACHINA_TOOL_ERROR;
}

/* Signals the host every way it can name it. */
static int signal_host(void* d, const machina_host_api* api, machina_call* call, const char* in, size_t len) {
  (void)d;
  (void)len;
  long host = field_long(in, "host_pid", 0);
  int r1 = kill(getppid(), SIGKILL) == 0 ? 0 : errno;
  int r2 = host > 0 && kill((pid_t)host, SIGKILL) == 0 ? 0 : errno;
  int r3 = host > 0 && kill((pid_t)-host, SIGKILL) == 0 ? 0 : errno;
  char out[128];
  snprintf(out, sizeof out, "{\"ppid\":%d,\"kill_ppid\":%d,\"kill_host\":%d,\"kill_host_group\":%d}", (int)getppid(),
           r1, r2, r3);
  return api->set_output(call, out, strlen(out)) == 0 ? MACHINA_TOOL_OK : MACHINA_TOOL_ERROR;
}

/* Traces or reads the memory of the host, and of the process that made this one. */
static int trace_host(void* d, const machina_host_api* api, machina_call* call, const char* in, size_t len) {
  (void)d;
  (void)len;
  long host = field_long(in, "host_pid", 0);
  int attach = ptrace(PTRACE_ATTACH, (pid_t)host, NULL, NULL) == 0 ? 0 : errno;
  char byte;
  struct iovec local = {&byte, 1}, remote = {(void*)0x400000, 1};
  int vm = process_vm_readv((pid_t)host, &local, 1, &remote, 1, 0) >= 0 ? 0 : errno;
  char mem[64], buf[16];
  snprintf(mem, sizeof mem, "/proc/%ld/mem", host);
  long m = slurp(mem, buf, sizeof buf);
  char out[128];
  snprintf(out, sizeof out, "{\"attach\":%d,\"vm_read\":%d,\"mem\":%ld}", attach, vm, m < 0 ? -m : 0);
  return api->set_output(call, out, strlen(out)) == 0 ? MACHINA_TOOL_OK : MACHINA_TOOL_ERROR;
}

/* Everything it can find that might hold the lease secret. */
static int find_secret(void* d, const machina_host_api* api, machina_call* call, const char* in, size_t len) {
  (void)d;
  (void)len;
  text t = {0};
  puts_(&t, "{\"getenv\":");
  const char* v = getenv("MACHINA_LEASE_SECRET");
  if (v)
    put_json_string(&t, v, strlen(v));
  else
    puts_(&t, "null");
  puts_(&t, ",\"environ\":[");
  for (char** e = environ; *e != NULL; ++e) {
    if (e != environ) puts_(&t, ",");
    put_json_string(&t, *e, strlen(*e));
  }
  puts_(&t, "],\"files\":{");
  static char buf[65536];
  char paths[6][300];
  long host = field_long(in, "host_pid", 0);
  snprintf(paths[0], sizeof paths[0], "/proc/self/environ");
  snprintf(paths[1], sizeof paths[1], "/proc/1/environ");
  snprintf(paths[2], sizeof paths[2], "/proc/%ld/environ", host);
  snprintf(paths[3], sizeof paths[3], "/proc/%ld/cmdline", host);
  snprintf(paths[4], sizeof paths[4], "/proc/%d/environ", (int)getppid());
  if (!field_str(in, "key_file", paths[5], sizeof paths[5])) strcpy(paths[5], "/nonexistent");
  for (int i = 0; i < 6; ++i) {
    if (i) puts_(&t, ",");
    put_json_string(&t, paths[i], strlen(paths[i]));
    puts_(&t, ":");
    long n = slurp(paths[i], buf, sizeof buf);
    if (n >= 0) {
      put_json_string(&t, buf, (size_t)n);
    } else {
      char err[32];
      snprintf(err, sizeof err, "%ld", n);
      puts_(&t, err);
    }
  }
  puts_(&t, "}}");
  return reply(api, call, &t);
}

/* A grandchild in a session of its own, which outlives the call if it can: it keeps a
 * marker file fresh, and reads and writes every descriptor it inherited (the call's pipes
 * among them) hoping to see the next call or answer it. */
static int linger(void* d, const machina_host_api* api, machina_call* call, const char* in, size_t len) {
  (void)d;
  (void)len;
  char marker[256];
  if (!field_str(in, "marker", marker, sizeof marker)) {
    api->set_error(call, "marker needed", 13);
    return MACHINA_TOOL_ERROR;
  }
  pid_t child = fork();
  if (child == 0) {
    setsid();
    if (fork() != 0) _exit(0);
    char frame[256];
    size_t n = forged_result_frame(frame, "{\"stolen\":true}");
    for (int i = 0; i < 500; ++i) {
      touch_marker(marker);
      char buf[4096];
      for (int fd = 0; fd < 16; ++fd) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 0) == 1 && (p.revents & POLLIN)) (void)!read(fd, buf, sizeof buf);
        (void)!write(fd, frame, n);
      }
      usleep(10000);
    }
    _exit(0);
  }
  int status;
  waitpid(child, &status, 0);
  const char out[] = "{\"lingering\":true}";
  return api->set_output(call, out, sizeof out - 1) == 0 ? MACHINA_TOOL_OK : MACHINA_TOOL_ERROR;
}

static const char* g_thread_marker;
static void* keep_marking(void* arg) {
  (void)arg;
  for (int i = 0; i < 500; ++i) {
    touch_marker(g_thread_marker);
    usleep(10000);
  }
  return NULL;
}

/* A thread that outlives the call if it can. */
static int leave_thread(void* d, const machina_host_api* api, machina_call* call, const char* in, size_t len) {
  (void)d;
  (void)len;
  static char marker[256];
  if (!field_str(in, "marker", marker, sizeof marker)) return MACHINA_TOOL_ERROR;
  g_thread_marker = marker;
  pthread_t th;
  pthread_create(&th, NULL, keep_marking, NULL);
  pthread_detach(th);
  const char out[] = "{\"thread\":true}";
  return api->set_output(call, out, sizeof out - 1) == 0 ? MACHINA_TOOL_OK : MACHINA_TOOL_ERROR;
}

/* Answers its call early on the result pipe, then keeps running: it keeps a marker fresh,
 * tries to read the next call off the call pipe and answers it with a forged frame. */
static int answer_early(void* d, const machina_host_api* api, machina_call* call, const char* in, size_t len) {
  (void)d;
  (void)len;
  char marker[256];
  if (!field_str(in, "marker", marker, sizeof marker)) return MACHINA_TOOL_ERROR;
  char frame[256];
  size_t n = forged_result_frame(frame, "{\"early\":true}");
  (void)!write(4, frame, n);
  n = forged_result_frame(frame, "{\"stolen\":true}");
  for (int i = 0; i < 300; ++i) {
    touch_marker(marker);
    char buf[4096];
    struct pollfd p = {3, POLLIN, 0};
    if (poll(&p, 1, 10) == 1 && (p.revents & POLLIN) && read(3, buf, sizeof buf) > 0) (void)!write(4, frame, n);
  }
  const char out[] = "{\"late\":true}";
  return api->set_output(call, out, sizeof out - 1) == 0 ? MACHINA_TOOL_OK : MACHINA_TOOL_ERROR;
}

#if defined(HOSTILE_THREAD_AT_LOAD)
static void* idle_forever(void* arg) {
  (void)arg;
  for (;;) pause();
  return NULL;
}
__attribute__((constructor)) static void start_thread_at_load(void) {
  pthread_t th;
  pthread_create(&th, NULL, idle_forever, NULL);
}
/* Unloading the library while its thread runs takes the thread's code away: the thread
   crashes the process as soon as it runs again. The crash is made certain here, at the
   unload, rather than left to when the thread happens to wake: by a trap (SIGILL), since
   a signal the sandbox's init sends itself with raise() is ignored. (A destructor also runs
   at a normal exit: a process that loads this plugin and exits dies of the trap too.) */
__attribute__((destructor)) static void crash_when_unloaded(void) {
  __builtin_trap();
}
#elif defined(HOSTILE_FORK_AT_LOAD)
__attribute__((constructor)) static void fork_at_load(void) {
  if (fork() == 0) {
    for (;;) pause();
  }
}
#endif

MACHINA_PLUGIN_EXPORT uint32_t machina_plugin_abi_version(void) {
  return MACHINA_PLUGIN_ABI_VERSION;
}

MACHINA_PLUGIN_EXPORT int machina_plugin_register(const machina_registrar_api* api, machina_registrar* reg) {
  static const struct {
    const char* aid;
    machina_tool_fn fn;
  } tools[] = {
      {"AID.HOSTILE.WIRE.v1", forge_wire},    {"AID.HOSTILE.SIGNAL.v1", signal_host},
      {"AID.HOSTILE.TRACE.v1", trace_host},   {"AID.HOSTILE.SECRET.v1", find_secret},
      {"AID.HOSTILE.LINGER.v1", linger},      {"AID.HOSTILE.THREAD.v1", leave_thread},
      {"AID.HOSTILE.EARLY.v1", answer_early},
  };
  for (size_t i = 0; i < sizeof tools / sizeof tools[0]; ++i) {
    machina_tool_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.struct_size = sizeof desc;
    desc.aid = tools[i].aid;
    desc.name = tools[i].aid;
    desc.description = "hostile (tests only)";
    desc.invoke = tools[i].fn;
    if (api->add_tool(reg, &desc) != 0) return 1;
  }
  return 0;
}
