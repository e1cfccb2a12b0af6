// See worker.hpp.
#include <machina/call_context.hpp>
#include <machina/errors.hpp>
#include <machina/tool_registry.hpp>
#include <machina/worker.hpp>
#include <machina/worker_protocol.hpp>

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace machina::worker {
namespace {

// When the host dies, take every process this worker's tools started with it: the
// worker leads its own process group.
void on_host_gone(int) { kill(0, SIGKILL); }

bool read_exact(int fd, char* data, std::size_t n) {
  while (n > 0) {
    const ssize_t got = ::read(fd, data, n);
    if (got > 0) {
      data += got;
      n -= static_cast<std::size_t>(got);
    } else if (got < 0 && errno == EINTR) {
      continue;
    } else {
      return false;
    }
  }
  return true;
}

bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

void complain(const std::string& what) {
  const std::string line = "machina-toolhost worker " + std::to_string(getpid()) + ": " + what + "\n";
  (void)!::write(STDERR_FILENO, line.data(), line.size());
}

}  // namespace

int run_worker(const WorkerConfig& config) {
  struct sigaction sa {};
  sa.sa_handler = on_host_gone;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGHUP, &sa, nullptr);
  prctl(PR_SET_PDEATHSIG, SIGHUP);
  if (config.parent_pid != 0 && getppid() != config.parent_pid) return 1;  // the host died before prctl

  try {
    apply_process_limits(config.limits);
    ToolRegistry registry(CircuitBreaker::Options{});
    for (const auto& p : config.plugins) registry.load_plugin(p);
    Hello hello;
    for (const auto& t : registry.list()) hello.aids.push_back(t.aid);
    std::string out;
    encode_hello(hello, out);
    if (!write_all(config.fd, out)) return 0;

    std::string payload;
    Call call;
    for (;;) {
      char header[kFrameHeader];
      if (!read_exact(config.fd, header, sizeof header)) return 0;  // the host closed: done
      std::uint32_t size = 0;
      FrameType type{};
      read_header(std::string_view(header, sizeof header), size, type);
      if (type != FrameType::call || size > config.max_frame_bytes) {
        complain("unexpected frame from the host");
        return 2;
      }
      payload.resize(size);
      if (!read_exact(config.fd, payload.data(), size)) return 0;
      if (!decode_call(payload, call)) {
        complain("malformed call frame from the host");
        return 2;
      }
      const Tool* tool = registry.find(call.aid);
      CallContext ctx(config.max_output_bytes, call.state ? call.state : std::make_shared<const Slots>());
      int rc = MACHINA_TOOL_FAULT;
      if (tool == nullptr) {
        ctx.error = "the worker has no tool " + call.aid;
      } else {
        start_cpu_budget(config.limits.cpu_seconds);
        rc = tool->invoke(tool->tool_data, &host_api(), ctx.as_call(), call.input_json.c_str(), call.input_json.size());
      }
      out.clear();
      encode_result(rc, ctx, out);
      if (!write_all(config.fd, out)) return 0;
      // Large buffers are not kept between calls.
      if (payload.capacity() > (1u << 20)) payload = std::string();
      if (out.capacity() > (1u << 20)) out = std::string();
    }
  } catch (const HostError& e) {
    complain(e.what());
    return 2;
  }
}

}  // namespace machina::worker
