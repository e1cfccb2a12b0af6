/* Lock-step latency driver for NDJSON hosts: starts the host on pipes, sends one request
 * line, waits for its one response line, and repeats; prints each round trip in
 * nanoseconds, one per line. A native driver, so that the figure is the host's and the
 * pipe's, not a Python client's.
 *
 *   lockstep [-c DRIVER_CPU] [-C HOST_CPU] [-e EXPECT] [-p] N WARMUP REQUEST [PRE...] -- CMD [ARG...]
 *
 * With -p the driver polls for each response instead of sleeping until it comes: what is
 * measured is then the host's own time and the pipe's, without the driver's wake-up (which
 * across two vCPUs of a virtual machine costs tens of microseconds, whoever the host is).
 *
 * PRE lines are sent once before the loop: "R:<line>" waits for one response line,
 * "N:<line>" expects none (e.g. a JSON-RPC notification). Every measured response must
 * contain EXPECT (default "\"ok\":true"); the exit status is non-zero otherwise. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { MAX_LINE = 16 << 20 };

static char* buf;
static size_t cap = 1 << 16, len;
static int polling;

static void pin(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) {
    perror("sched_setaffinity");
    exit(2);
  }
}

static void write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      perror("write to host");
      exit(2);
    }
    p += w;
    n -= (size_t)w;
  }
}

/* Reads one line into buf (without the newline); the host answers one line per request,
 * so nothing past it is pending. */
static void read_line(int fd) {
  len = 0;
  for (;;) {
    if (len == cap) {
      if (cap >= MAX_LINE) {
        fprintf(stderr, "response over %d bytes\n", MAX_LINE);
        exit(2);
      }
      cap *= 2;
      buf = realloc(buf, cap);
    }
    ssize_t r = read(fd, buf + len, cap - len);
    if (r < 0 && (errno == EINTR || (polling && errno == EAGAIN))) continue;
    if (r <= 0) {
      fprintf(stderr, "host closed its output\n");
      exit(2);
    }
    char* nl = memchr(buf + len, '\n', (size_t)r);
    len += (size_t)r;
    if (nl) {
      len = (size_t)(nl - buf);
      return;
    }
  }
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int main(int argc, char** argv) {
  int driver_cpu = -1, host_cpu = -1, opt;
  const char* expect = "\"ok\":true";
  while ((opt = getopt(argc, argv, "+c:C:e:p")) != -1) {
    if (opt == 'p')
      polling = 1;
    else if (opt == 'c')
      driver_cpu = atoi(optarg);
    else if (opt == 'C')
      host_cpu = atoi(optarg);
    else if (opt == 'e')
      expect = optarg;
    else
      return 2;
  }
  int sep = optind;
  while (sep < argc && strcmp(argv[sep], "--") != 0) ++sep;
  if (argc - optind < 3 || sep + 1 >= argc) {
    fprintf(stderr, "usage: lockstep [-c CPU] [-C CPU] [-e EXPECT] [-p] N WARMUP REQUEST [PRE...] -- CMD [ARG...]\n");
    return 2;
  }
  long n = atol(argv[optind]), warmup = atol(argv[optind + 1]);
  const char* request = argv[optind + 2];
  size_t request_len = strlen(request);
  char* line = malloc(request_len + 2);
  memcpy(line, request, request_len);
  line[request_len] = '\n';

  int to_host[2], from_host[2];
  if (pipe(to_host) != 0 || pipe(from_host) != 0) return 2;
  pid_t pid = fork();
  if (pid < 0) return 2;
  if (pid == 0) {
    pin(host_cpu);
    dup2(to_host[0], 0);
    dup2(from_host[1], 1);
    close(to_host[0]);
    close(to_host[1]);
    close(from_host[0]);
    close(from_host[1]);
    execvp(argv[sep + 1], argv + sep + 1);
    perror("exec");
    _exit(127);
  }
  close(to_host[0]);
  close(from_host[1]);
  pin(driver_cpu);
  signal(SIGPIPE, SIG_IGN);
  buf = malloc(cap);

  for (int i = optind + 3; i < sep; ++i) {
    const char* pre = argv[i];
    write_all(to_host[1], pre + 2, strlen(pre + 2));
    write_all(to_host[1], "\n", 1);
    if (pre[0] == 'R') read_line(from_host[0]);
  }
  if (polling) fcntl(from_host[0], F_SETFL, fcntl(from_host[0], F_GETFL) | O_NONBLOCK);
  int64_t* lat = malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
  long bad = 0;
  for (long i = -warmup; i < n; ++i) {
    int64_t t0 = now_ns();
    write_all(to_host[1], line, request_len + 1);
    read_line(from_host[0]);
    int64_t t1 = now_ns();
    if (i >= 0) {
      lat[i] = t1 - t0;
      buf[len] = 0;
      if (!strstr(buf, expect)) {
        if (bad++ == 0) fprintf(stderr, "unexpected response: %.300s\n", buf);
      }
    }
  }
  close(to_host[1]);
  int status = 0;
  waitpid(pid, &status, 0);
  for (long i = 0; i < n; ++i) printf("%lld\n", (long long)lat[i]);
  if (bad) {
    fprintf(stderr, "%ld of %ld responses did not contain %s\n", bad, n, expect);
    return 1;
  }
  return 0;
}
