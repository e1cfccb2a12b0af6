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
#include <algorithm>

namespace machina::worker {
namespace {

// When the host dies, take every process this worker's tools started with it: the
// worker leads its own process group.
void on_host_gone(int) { kill(0, SIGKILL); }

/// Frames from the host, read in large chunks: a small call costs one read(2).
class FrameReader {
 public:
  explicit FrameReader(int fd) : fd_(fd) {}

  /// The next frame's payload (valid until the next call); false at end of input.
  bool next(std::size_t max_payload, FrameType& type, std::string_view& payload, bool& too_large) {
    too_large = false;
    std::uint32_t size = 0;
    if (!fill(kFrameHeader)) return false;
    read_header(std::string_view(buf_).substr(begin_), size, type);
    if (size > max_payload) {
      too_large = true;
      return true;
    }
    if (!fill(kFrameHeader + size)) return false;
    payload = std::string_view(buf_).substr(begin_ + kFrameHeader, size);
    begin_ += kFrameHeader + size;
    return true;
  }

 private:
  // Makes at least `n` unread bytes available.
  bool fill(std::size_t n) {
    if (end_ - begin_ >= n) return true;
    if (begin_ > 0) {  // only the unread bytes move; the buffer keeps its size
      std::memmove(buf_.data(), buf_.data() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    if (buf_.size() < std::max(n, kChunk)) buf_.resize(std::max(n, kChunk));
    while (end_ < n) {
      const ssize_t got = ::read(fd_, buf_.data() + end_, buf_.size() - end_);
      if (got > 0) end_ += static_cast<std::size_t>(got);
      else if (got < 0 && errno == EINTR) continue;
      else return false;
    }
    return true;
  }

  static constexpr std::size_t kChunk = 64 * 1024;
  int fd_;
  std::string buf_;
  std::size_t begin_ = 0, end_ = 0;
};

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
    CpuBudget cpu_budget(config.limits.cpu_seconds);
    ToolRegistry registry(CircuitBreaker::Options{});
    config.load_tools(registry);
    Hello hello;
    for (const auto& t : registry.list()) hello.aids.push_back(t.aid);
    std::string out;
    encode_hello(hello, out);
    if (!write_all(config.result_fd, out)) return 0;

    FrameReader frames(config.call_fd);
    Call call;
    for (;;) {
      FrameType type{};
      std::string_view payload;
      bool too_large = false;
      if (!frames.next(config.max_frame_bytes, type, payload, too_large)) return 0;  // the host closed: done
      if (type != FrameType::call || too_large) {
        complain("unexpected frame from the host");
        return 2;
      }
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
        cpu_budget.start();
        rc = tool->invoke(tool->tool_data, &host_api(), ctx.as_call(), call.input_json.c_str(), call.input_json.size());
        cpu_budget.stop();
      }
      out.clear();
      encode_result(rc, ctx, out);
      if (!write_all(config.result_fd, out)) return 0;
      if (out.capacity() > (1u << 20)) out = std::string();  // large buffers are not kept
    }
  } catch (const HostError& e) {
    complain(e.what());
    return 2;
  }
}

}  // namespace machina::worker
