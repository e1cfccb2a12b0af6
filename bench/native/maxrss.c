/* Runs a command and prints its peak resident set size in KiB (ru_maxrss from wait4) on
 * stderr as "maxrss_kib=N". A small C parent, so that the figure is the command's own and
 * not inherited from a large parent (a Python process forked to exec it). */
#include <stdio.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: maxrss CMD [ARG...]\n");
    return 2;
  }
  pid_t pid = fork();
  if (pid < 0) return 2;
  if (pid == 0) {
    execvp(argv[1], argv + 1);
    perror("exec");
    _exit(127);
  }
  int status = 0;
  struct rusage ru;
  if (wait4(pid, &status, 0, &ru) < 0) return 2;
  fprintf(stderr, "maxrss_kib=%ld\n", ru.ru_maxrss);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}
