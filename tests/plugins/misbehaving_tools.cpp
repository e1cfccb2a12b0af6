// Tools that misbehave on purpose, for the fault tests. Never shipped.
#include <machina/plugin.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <vector>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

extern char** environ;

namespace {

using machina::plugin::Call;
using machina::plugin::Registry;
using machina::plugin::Result;

std::atomic<long> g_counter{0};

// Reads an unsigned integer field from a flat JSON object such as {"ms": 20}.
long field(std::string_view input, std::string_view name, long fallback) {
  const std::string key = "\"" + std::string(name) + "\"";
  const auto at = input.find(key);
  if (at == std::string_view::npos) return fallback;
  const auto colon = input.find(':', at);
  if (colon == std::string_view::npos) return fallback;
  return std::strtol(std::string(input.substr(colon + 1)).c_str(), nullptr, 10);
}

// CLOCK_MONOTONIC in nanoseconds: comparable across the processes of one machine.
long monotonic_ns() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return now.tv_sec * 1'000'000'000L + now.tv_nsec;
}

void fill(Registry& r) {
  r.tool("AID.TEST.CRASH.v1", [](Call&) -> Result {
     std::raise(SIGSEGV);
     return Result::fault;
   }).description("Dies of SIGSEGV.");
  r.tool("AID.TEST.ABORT.v1", [](Call&) -> Result { std::abort(); }).description("Calls abort().");
  r.tool("AID.TEST.EXIT.v1", [](Call&) -> Result { std::_Exit(3); }).description("Exits the process with status 3.");
  r.tool("AID.TEST.THROW.v1", [](Call&) -> Result {
     throw std::runtime_error("deliberate failure");
   }).description("Throws; the C++ layer reports a fault.");
  r.tool("AID.TEST.HANG.v1", [](Call&) -> Result {
     for (;;) pause();
   }).description("Never returns.");
  r.tool("AID.TEST.PRINT.v1", [](Call& call) -> Result {
     std::printf("{\"ok\":true,\"status\":\"OK\",\"forged\":true}\n");
     std::fflush(stdout);
     const char raw[] = "raw bytes on fd 1\n";
     (void)!write(1, raw, sizeof raw - 1);
     call.output(R"({"printed":true})");
     return Result::ok;
   }).description("Writes to stdout (fd 1) and then answers normally.");
  r.tool("AID.TEST.HUGE.v1", [](Call& call) -> Result {
     const long n = field(call.input(), "bytes", 2 * 1024 * 1024);
     std::string out = "\"" + std::string(static_cast<std::size_t>(n), 'x') + "\"";
     if (!call.output(out)) return call.fail("output refused by the host");
     return Result::ok;
   }).description("Outputs a JSON string of `bytes` characters (default 2 MiB).");
  r.tool("AID.TEST.BADJSON.v1", [](Call& call) -> Result {
     call.output("{not json");
     return Result::ok;
   }).description("Reports success with output that is not JSON.");
  r.tool("AID.TEST.NOOUTPUT.v1", [](Call&) -> Result {
     return Result::ok;
   }).description("Reports success without setting an output.");
  r.tool("AID.TEST.FAIL.v1", [](Call& call) -> Result {
     return call.fail("the tool said no");
   }).description("Returns a TOOL_ERROR.");
  r.tool("AID.TEST.BADUTF8.v1", [](Call& call) -> Result {
     return call.fail("bad \xff byte");
   }).description("Returns an error message that is not UTF-8.");
  r.tool("AID.TEST.SLOW.v1",
         [](Call& call) -> Result {
           const long ms = field(call.input(), "ms", 50);
           const long started = monotonic_ns();
           std::this_thread::sleep_for(std::chrono::milliseconds(ms));
           const long ended = monotonic_ns();
           const long n = ++g_counter;
           std::string out = "{\"slept_ms\":" + std::to_string(ms) + ",\"calls\":" + std::to_string(n);
           if (field(call.input(), "stamps", 0) != 0) {
             out += ",\"started_ns\":" + std::to_string(started) + ",\"ended_ns\":" + std::to_string(ended);
           }
           call.output(out + "}");
           return Result::ok;
         })
      .description(
          "Sleeps `ms` milliseconds, then reports how many calls this process ran (with \"stamps\": 1, "
          "also when it started and ended, in CLOCK_MONOTONIC nanoseconds, the clock of Python's "
          "time.monotonic_ns()).");
  r.tool("AID.TEST.COUNTER.v1", [](Call& call) -> Result {
     call.output("{\"calls\":" + std::to_string(++g_counter) + "}");
     return Result::ok;
   }).description("Counts its calls (not deterministic: shows whether a call really ran).");
  r.tool("AID.TEST.TIER2.v1",
         [](Call& call) -> Result {
           call.output(R"({"system":true})");
           return Result::ok;
         })
      .description("A tier-2 (system) tool.")
      .tier(MACHINA_TIER_SYSTEM);
  r.tool("AID.TEST.CONNECT.v1", [](Call& call) -> Result {
     const long port = field(call.input(), "port", 0);
     const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
     if (fd < 0) return call.fail(std::string("socket: ") + std::strerror(errno));
     sockaddr_in addr{};
     addr.sin_family = AF_INET;
     addr.sin_port = htons(static_cast<std::uint16_t>(port));
     addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
     const int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
     const int err = errno;
     ::close(fd);
     if (rc != 0) return call.fail(std::string("connect: ") + std::strerror(err));
     call.output(R"({"connected":true})");
     return Result::ok;
   }).description("Connects to 127.0.0.1:`port` over TCP.");
  r.tool("AID.TEST.SOCKET32.v1", [](Call& call) -> Result {
  // socket(AF_INET, SOCK_STREAM, 0) through the 32-bit system call ABI (int 0x80,
  // call 359), the way around filters that only know native calls.
#if defined(__x86_64__)
     long rc = 359;
     asm volatile("int $0x80" : "+a"(rc) : "b"(2), "c"(1), "d"(0) : "memory");
     if (rc < 0) return call.fail("socket32: error " + std::to_string(-rc));
     ::close(static_cast<int>(rc));
     call.output(R"({"socket32":true})");
     return Result::ok;
#else
     return call.fail("socket32: not x86-64");
#endif
   }).description("Creates a socket through the 32-bit system call ABI.");
  r.tool("AID.TEST.EXEC.v1", [](Call& call) -> Result {
     // Input: a flat JSON array of strings, the argv of a program to run; output: its
     // exit status and the first bytes of its stdout.
     std::vector<std::string> args;
     const std::string_view in = call.input();
     for (std::size_t i = 0; i < in.size(); ++i) {
       if (in[i] != '"') continue;
       const std::size_t end = in.find('"', i + 1);
       args.emplace_back(in.substr(i + 1, end - i - 1));
       i = end;
     }
     if (args.empty()) return call.fail("no program");
     int out[2];
     if (pipe(out) != 0) return call.fail("pipe failed");
     posix_spawn_file_actions_t fa;
     posix_spawn_file_actions_init(&fa);
     posix_spawn_file_actions_adddup2(&fa, out[1], 1);
     posix_spawn_file_actions_addclose(&fa, out[0]);
     std::vector<char*> argv;
     for (auto& a : args) argv.push_back(a.data());
     argv.push_back(nullptr);
     pid_t pid = -1;
     const int rc = posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), environ);
     posix_spawn_file_actions_destroy(&fa);
     ::close(out[1]);
     if (rc != 0) {
       ::close(out[0]);
       return call.fail(std::string("spawn: ") + std::strerror(rc));
     }
     std::string text;
     char buf[4096];
     for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) {
       if (text.size() < 4096) text.append(buf, static_cast<std::size_t>(n));
     }
     ::close(out[0]);
     int status = 0;
     waitpid(pid, &status, 0);
     std::string json =
         "{\"status\":" + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)) +
         ",\"bytes\":" + std::to_string(text.size()) + ",\"first\":\"";
     for (char c : text.substr(0, 64)) {
       if (c == '"' || c == '\\')
         json += '_';
       else if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x80)
         json += ' ';
       else
         json += c;
     }
     json += "\"}";
     call.output(json);
     return Result::ok;
   }).description("Runs a program (input: its argv as a JSON array of strings).");
  r.tool("AID.TEST.ALLOC.v1", [](Call& call) -> Result {
     const long mb = field(call.input(), "mb", 64);
     std::vector<char> block;
     try {
       block.resize(static_cast<std::size_t>(mb) << 20, 1);
     } catch (const std::bad_alloc&) {
       return call.fail("allocation of " + std::to_string(mb) + " MiB failed");
     }
     call.output("{\"allocated_mb\":" + std::to_string(mb) + "}");
     return Result::ok;
   }).description("Allocates and touches `mb` MiB.");
  r.tool("AID.TEST.OPENFILES.v1", [](Call& call) -> Result {
     const long n = field(call.input(), "n", 100);
     std::vector<int> fds;
     for (long i = 0; i < n; ++i) {
       const int fd = ::open("/dev/null", O_RDONLY);
       if (fd < 0) break;
       fds.push_back(fd);
     }
     for (int fd : fds) ::close(fd);
     call.output("{\"opened\":" + std::to_string(fds.size()) + "}");
     return Result::ok;
   }).description("Opens up to `n` files at once; reports how many it could.");
  r.tool("AID.TEST.WRITEFILE.v1", [](Call& call) -> Result {
     const long kb = field(call.input(), "kb", 1024);
     char path[] = "/tmp/machina-test-writefile-XXXXXX";
     const int fd = mkstemp(path);
     if (fd < 0) return call.fail("mkstemp failed");
     unlink(path);
     const std::string chunk(1024, 'x');
     long written = 0;
     int err = 0;
     for (long i = 0; i < kb; ++i) {
       if (::write(fd, chunk.data(), chunk.size()) != static_cast<ssize_t>(chunk.size())) {
         err = errno;
         break;
       }
       ++written;
     }
     ::close(fd);
     if (err != 0) return call.fail("write failed after " + std::to_string(written) + " KiB: " + std::strerror(err));
     call.output("{\"written_kb\":" + std::to_string(written) + "}");
     return Result::ok;
   }).description("Writes `kb` KiB to a temporary file.");
  r.tool("AID.TEST.SPIN.v1", [](Call& call) -> Result {
     // CPU time, not wall time: on a busy machine the two differ.
     const long ms = field(call.input(), "ms", 100);
     auto cpu_ms = [] {
       timespec t{};
       clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
       return t.tv_sec * 1000L + t.tv_nsec / 1'000'000L;
     };
     const long until = cpu_ms() + ms;
     volatile unsigned long x = 0;
     while (cpu_ms() < until) x = x + 1;
     call.output("{\"spun_ms\":" + std::to_string(ms) + "}");
     return Result::ok;
   }).description("Burns `ms` milliseconds of CPU time.");
  r.tool("AID.TEST.SLEEPER.v1", [](Call& call) -> Result {
     // Starts `sleep N` (in this process group; N = "seconds", default 300, which lets a
     // test tell its own child from any other) and then hangs: a timeout must take the
     // child too. Output names the child's pid first, on stderr.
     pid_t pid = -1;
     char prog[] = "sleep";
     std::string seconds = std::to_string(field(call.input(), "seconds", 300));
     char* argv[] = {prog, seconds.data(), nullptr};
     if (posix_spawnp(&pid, "sleep", nullptr, nullptr, argv, environ) != 0) return call.fail("spawn failed");
     std::fprintf(stderr, "sleeper child pid %d\n", static_cast<int>(pid));
     std::fflush(stderr);
     (void)call;
     for (;;) pause();
   }).description("Starts a child `sleep N` (\"seconds\", default 300), then never returns.");
  r.tool("AID.TEST.TIMEOUT_DEFAULT.v1",
         [](Call& call) -> Result {
           const long ms = field(call.input(), "ms", 0);
           std::this_thread::sleep_for(std::chrono::milliseconds(ms));
           call.output("{}");
           return Result::ok;
         })
      .description("Sleeps `ms`; declares its own default deadline of 150 ms.")
      .timeout_ms(150);
  r.tool("AID.TEST.NOISYCRASH.v1", [](Call& call) -> Result {
     const long n = field(call.input(), "bytes", 100);
     const std::string noise(static_cast<std::size_t>(n), 'x');
     (void)!::write(2, noise.data(), noise.size());
     (void)!::write(2, "LAST WORDS\n", 11);
     std::raise(SIGSEGV);
     return Result::fault;
   }).description("Writes `bytes` x's and LAST WORDS to stderr, then dies of SIGSEGV.");
  r.tool("AID.TEST.SLOTFAIL.v1", [](Call& call) -> Result {
     call.set_slot(0, {"note", "\"written\"", "test", 9});
     return call.fail("failed after writing a slot");
   }).description("Writes DS0, then fails: a failed call must change no state.");
}

}  // namespace

MACHINA_PLUGIN(fill)
