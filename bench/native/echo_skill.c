/* A skill (the skill protocol, docs/specifications.md) in C with one tool, `echo`, that
 * answers its arguments at once: the skill whose own work is next to nothing, so that a
 * benchmark sees what a host adds to a
 * JSON-RPC round trip. One message a line on stdin and stdout; `initialize` lists the tool,
 * `tools/call` answers {"content": "ok", "structuredContent": <arguments>}, lifecycle
 * methods and `ping` answer, `shutdown` answers and exits. Ids are echoed as written. It
 * reads the shape our own host and the benchmark driver write (not any JSON a client may
 * send): the id's value ends at the first ',' or '}' after "id":. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_LINE = 1 << 20 };

static const char* find_value(const char* line, const char* key) {
  const char* at = strstr(line, key);
  if (at == NULL) return NULL;
  at += strlen(key);
  while (*at == ' ' || *at == ':') at++;
  return at;
}

/* The length of the JSON object starting at p (braces matched outside strings). */
static size_t object_length(const char* p) {
  int depth = 0, in_string = 0;
  for (const char* q = p; *q; q++) {
    if (in_string) {
      if (*q == '\\' && q[1])
        q++;
      else if (*q == '"')
        in_string = 0;
    } else if (*q == '"') {
      in_string = 1;
    } else if (*q == '{') {
      depth++;
    } else if (*q == '}' && --depth == 0) {
      return (size_t)(q - p) + 1;
    }
  }
  return 0;
}

int main(void) {
  static char line[MAX_LINE];
  setvbuf(stdout, NULL, _IOFBF, 1 << 16);
  while (fgets(line, sizeof line, stdin) != NULL) {
    const char* id = find_value(line, "\"id\"");
    const char* method = find_value(line, "\"method\"");
    if (id == NULL || method == NULL) continue; /* a notification, or an answer */
    const int id_len = (int)strcspn(id, ",}");
    if (strncmp(method, "\"tools/call\"", 12) == 0) {
      const char* args = find_value(line, "\"arguments\"");
      const size_t n = args != NULL && *args == '{' ? object_length(args) : 0;
      printf("{\"jsonrpc\":\"2.0\",\"id\":%.*s,\"result\":{\"content\":\"ok\",\"structuredContent\":%.*s}}\n", id_len,
             id, n > 0 ? (int)n : 2, n > 0 ? args : "{}");
    } else if (strncmp(method, "\"initialize\"", 12) == 0) {
      printf(
          "{\"jsonrpc\":\"2.0\",\"id\":%.*s,\"result\":{\"name\":\"echo\",\"description\":\"echoes\","
          "\"version\":\"1\",\"tools\":[{\"name\":\"echo\",\"description\":\"its arguments\","
          "\"parameters\":{\"type\":\"object\"}}]}}\n",
          id_len, id);
    } else if (strncmp(method, "\"ping\"", 6) == 0) {
      printf("{\"jsonrpc\":\"2.0\",\"id\":%.*s,\"result\":{}}\n", id_len, id);
    } else {
      printf("{\"jsonrpc\":\"2.0\",\"id\":%.*s,\"result\":{\"ok\":true}}\n", id_len, id);
      if (strncmp(method, "\"shutdown\"", 10) == 0) {
        fflush(stdout);
        return 0;
      }
    }
    fflush(stdout);
  }
  return 0;
}
