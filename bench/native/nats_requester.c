/* A NATS load driver on the NATS C client (libnats): sends N requests to one subject and
 * matches their replies, printing one JSON object of results on stdout.
 *
 *   nats_requester [-l] [-n N] [-w WINDOW] [-W WARMUP] [-s SUBJECT] [-b BODY] [-e EXPECT]
 *                  [-k KEY_PREFIX] [-t SECONDS] [-a|-B] URL
 *
 * Pipelined (the default): WINDOW requests in flight; each reply, as it arrives, sends the
 * next request, so the driver never waits on a thread of its own between calls. Replies
 * come to one wildcard subscription on a private inbox (_INBOX.<nuid>.<i>) and are matched
 * to their request by <i>: a reply to no request, or a second one, is counted `unmatched`.
 * Lock-step (-l): one request at a time, each round trip timed; prints percentiles.
 *
 * With -k every request carries the header Idempotency-Key: KEY_PREFIX-<i> (a key of its own).
 * Every reply must contain EXPECT (default "\"ok\":true"), else it counts in `errors`.
 * Requests go out at once (-a, the lock-step default) or buffered by the client's flusher
 * (-B, the pipelined default). WARMUP requests (default: WINDOW) run before the timed ones.
 * The exit status is non-zero when a reply failed to come within SECONDS (default 120),
 * or when any reply was an error or unmatched. */
#define _GNU_SOURCE
#include <nats/nats.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { SENT = 1, DONE = 2 };

static natsConnection* nc;
static const char* subject = "machina.call";
static const char* body = "{\"aid\":\"AID.ECHO.v1\",\"input_json\":\"{\\\"msg\\\":\\\"hello\\\",\\\"n\\\":1}\"}";
static int body_len;
static const char* expect = "\"ok\":true";
static const char* key_prefix = NULL;
static size_t expect_len;
static char inbox[64];
static size_t inbox_len;

/* The run under way: requests [first, last) of `state`. */
static uint8_t* state;
static int64_t* sent_ns;
static int64_t* rtt_ns;
static long next_request, last_request, done, errors, unmatched;
static natsStatus publish_error = NATS_OK;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t finished = PTHREAD_COND_INITIALIZER;

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Sends request i (the caller does not hold `mu`). */
static void send_request(long i) {
  char reply[96];
  snprintf(reply, sizeof reply, "%s%ld", inbox, i);
  pthread_mutex_lock(&mu);
  state[i] = SENT;
  sent_ns[i] = now_ns();
  pthread_mutex_unlock(&mu);
  natsStatus s;
  if (key_prefix == NULL) {
    s = natsConnection_PublishRequest(nc, subject, reply, body, body_len);
  } else {
    char key[160];
    snprintf(key, sizeof key, "%s-%ld", key_prefix, i);
    natsMsg* m = NULL;
    s = natsMsg_Create(&m, subject, reply, body, body_len);
    if (s == NATS_OK) s = natsMsgHeader_Set(m, "Idempotency-Key", key);
    if (s == NATS_OK) s = natsConnection_PublishMsg(nc, m);
    natsMsg_Destroy(m);
  }
  if (s != NATS_OK) publish_error = s;
}

static void on_reply(natsConnection* c, natsSubscription* sub, natsMsg* msg, void* closure) {
  (void)c, (void)sub, (void)closure;
  const int64_t t = now_ns();
  const char* subj = natsMsg_GetSubject(msg);
  char* end = NULL;
  const long i = strncmp(subj, inbox, inbox_len) == 0 ? strtol(subj + inbox_len, &end, 10) : -1;
  long to_send = -1;
  pthread_mutex_lock(&mu);
  if (i < 0 || i >= last_request || end == NULL || *end != '\0' || state[i] != SENT) {
    ++unmatched;
  } else {
    state[i] = DONE;
    rtt_ns[i] = t - sent_ns[i];
    const char* data = natsMsg_GetData(msg);
    if (data == NULL || memmem(data, (size_t)natsMsg_GetDataLength(msg), expect, expect_len) == NULL) {
      if (errors++ == 0) {
        const char* status = NULL;
        natsMsgHeader_Get(msg, "Status", &status);
        fprintf(stderr, "nats_requester: the first reply without %s: status %s, body %.300s\n", expect,
                status ? status : "-", data ? data : "");
      }
    }
    if (next_request < last_request) to_send = next_request++;
    if (++done == last_request) pthread_cond_signal(&finished);
  }
  pthread_mutex_unlock(&mu);
  natsMsg_Destroy(msg);
  if (to_send >= 0) send_request(to_send);
}

/* Runs requests [first, first + n) with `window` in flight; false if they did not all
 * come back within `timeout_s`. */
static bool run(long first, long n, long window, double timeout_s) {
  pthread_mutex_lock(&mu);
  done = first;
  last_request = first + n;
  next_request = first + (window < n ? window : n);
  const long start_to = next_request;
  pthread_mutex_unlock(&mu);
  for (long i = first; i < start_to; ++i) send_request(i);
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += (time_t)timeout_s;
  bool ok = true;
  pthread_mutex_lock(&mu);
  while (done < last_request && ok) ok = pthread_cond_timedwait(&finished, &mu, &deadline) == 0;
  ok = done == last_request;
  pthread_mutex_unlock(&mu);
  return ok;
}

static int cmp_i64(const void* a, const void* b) {
  const int64_t x = *(const int64_t*)a, y = *(const int64_t*)b;
  return (x > y) - (x < y);
}

/* Nearest-rank percentile, in microseconds. */
static double pct_us(const int64_t* sorted, long n, double q) {
  long k = (long)(q / 100.0 * (double)n + 0.999999999) - 1;
  if (k < 0) k = 0;
  if (k >= n) k = n - 1;
  return (double)sorted[k] / 1e3;
}

static void usage(void) {
  fprintf(stderr,
          "usage: nats_requester [-l] [-n N] [-w WINDOW] [-W WARMUP] [-s SUBJECT] [-b BODY] [-e EXPECT] "
          "[-k KEY_PREFIX] [-t SECONDS] [-a|-B] URL\n");
  exit(2);
}

int main(int argc, char** argv) {
  long n = 100000, window = 256, warmup = -1;
  double timeout_s = 120;
  bool lockstep = false;
  int asap = -1;
  int opt;
  while ((opt = getopt(argc, argv, "ln:w:W:s:b:e:k:t:aB")) != -1) {
    switch (opt) {
      case 'l': lockstep = true; break;
      case 'n': n = atol(optarg); break;
      case 'w': window = atol(optarg); break;
      case 'W': warmup = atol(optarg); break;
      case 's': subject = optarg; break;
      case 'b': body = optarg; break;
      case 'e': expect = optarg; break;
      case 'k': key_prefix = optarg; break;
      case 't': timeout_s = atof(optarg); break;
      case 'a': asap = 1; break;
      case 'B': asap = 0; break;
      default: usage();
    }
  }
  if (optind != argc - 1 || n < 1 || window < 1) usage();
  if (lockstep) window = 1;
  if (asap < 0) asap = lockstep;
  if (warmup < 0) warmup = lockstep ? 200 : window;
  body_len = (int)strlen(body);
  expect_len = strlen(expect);

  natsOptions* opts = NULL;
  natsStatus s = natsOptions_Create(&opts);
  if (s == NATS_OK) s = natsOptions_SetURL(opts, argv[optind]);
  if (s == NATS_OK) s = natsOptions_SetSendAsap(opts, asap == 1);
  if (s == NATS_OK) s = natsOptions_SetIOBufSize(opts, 256 * 1024);
  if (s == NATS_OK) s = natsOptions_SetMaxPendingMsgs(opts, (int)(window * 2 + 1024));
  if (s == NATS_OK) s = natsConnection_Connect(&nc, opts);
  if (s != NATS_OK) {
    fprintf(stderr, "nats_requester: cannot connect to %s: %s\n", argv[optind], natsStatus_GetText(s));
    return 2;
  }
  natsInbox* unique = NULL;
  if (natsInbox_Create(&unique) != NATS_OK) return 2;
  inbox_len = (size_t)snprintf(inbox, sizeof inbox, "%s.", unique);
  natsInbox_Destroy(unique);
  char wildcard[80];
  snprintf(wildcard, sizeof wildcard, "%s*", inbox);
  natsSubscription* sub = NULL;
  s = natsConnection_Subscribe(&sub, nc, wildcard, on_reply, NULL);
  if (s == NATS_OK) s = natsSubscription_SetPendingLimits(sub, -1, -1);
  if (s == NATS_OK) s = natsConnection_FlushTimeout(nc, 5000);
  if (s != NATS_OK) {
    fprintf(stderr, "nats_requester: cannot subscribe to %s: %s\n", wildcard, natsStatus_GetText(s));
    return 2;
  }

  const long total = warmup + n;
  state = calloc((size_t)total, 1);
  sent_ns = calloc((size_t)total, sizeof *sent_ns);
  rtt_ns = calloc((size_t)total, sizeof *rtt_ns);
  if (state == NULL || sent_ns == NULL || rtt_ns == NULL) return 2;

  bool ok = warmup == 0 || run(0, warmup, window, timeout_s);
  const long warm_errors = errors;
  const int64_t t0 = now_ns();
  if (ok) ok = run(warmup, n, window, timeout_s);
  const double seconds = (double)(now_ns() - t0) / 1e9;

  pthread_mutex_lock(&mu);
  const long answered = done - warmup;
  const long errs = errors - warm_errors, unm = unmatched;
  pthread_mutex_unlock(&mu);
  printf(
      "{\"mode\":\"%s\",\"subject\":\"%s\",\"calls\":%ld,\"window\":%ld,\"asap\":%s,\"answered\":%ld,"
      "\"errors\":%ld,\"unmatched\":%ld,\"seconds\":%.6f,\"calls_per_s\":%.1f",
      lockstep ? "lockstep" : "pipelined", subject, n, window, asap ? "true" : "false", answered, errs, unm, seconds,
      answered > 0 ? (double)answered / seconds : 0.0);
  if (lockstep && ok) {
    int64_t* sorted = rtt_ns + warmup;
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_i64);
    double sum = 0;
    for (long i = 0; i < n; ++i) sum += (double)sorted[i];
    printf(",\"p50_us\":%.2f,\"p90_us\":%.2f,\"p99_us\":%.2f,\"max_us\":%.2f,\"mean_us\":%.2f", pct_us(sorted, n, 50),
           pct_us(sorted, n, 90), pct_us(sorted, n, 99), (double)sorted[n - 1] / 1e3, sum / (double)n / 1e3);
  }
  printf("}\n");
  fflush(stdout);
  if (!ok) fprintf(stderr, "nats_requester: %ld of %ld replies came within %.0f s\n", answered, n, timeout_s);
  if (publish_error != NATS_OK)
    fprintf(stderr, "nats_requester: a publish failed: %s\n", natsStatus_GetText(publish_error));

  natsSubscription_Unsubscribe(sub);
  natsSubscription_Destroy(sub);
  natsConnection_Destroy(nc);
  natsOptions_Destroy(opts);
  free(state);
  free(sent_ns);
  free(rtt_ns);
  return ok && errs == 0 && unm == 0 && publish_error == NATS_OK ? 0 : 1;
}
