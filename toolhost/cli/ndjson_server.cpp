// See ndjson_server.hpp.
#include "ndjson_server.hpp"

#include "line_reader.hpp"

#include <machina/wire.hpp>

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

namespace machina::cli {
namespace {

constexpr std::size_t kFlushAt = 64 * 1024;

bool is_blank(std::string_view line) {
  for (char c : line) {
    if (c != ' ' && c != '\t' && c != '\r' && c != '\n') return false;
  }
  return true;
}

// Responses already made but not yet written when a tool brings the process down
// (inline mode runs tools in this process): written out by the fatal-signal and exit
// handlers, so a crash loses only the request that caused it.
std::atomic<const char*> g_unsent_data{nullptr};
std::atomic<std::size_t> g_unsent_size{0};
int g_wire_fd = -1;

void write_unsent() {
  const char* data = g_unsent_data.exchange(nullptr);
  const std::size_t size = g_unsent_size.load();
  if (data == nullptr || g_wire_fd < 0) return;
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(g_wire_fd, data + done, size - done);
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
}

void on_fatal_signal(int sig) {
  write_unsent();
  signal(sig, SIG_DFL);
  raise(sig);
}

void install_unsent_handlers(int wire_fd) {
  g_wire_fd = wire_fd;
  static bool installed = false;
  if (installed) return;
  installed = true;
  std::atexit(write_unsent);
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) {
    struct sigaction sa {};
    sa.sa_handler = on_fatal_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND | SA_NODEFER;
    sigaction(sig, &sa, nullptr);
  }
}

int serve_inline(Host& host, const ServeOptions& o) {
  install_unsent_handlers(o.out_fd);
  LineReader reader(o.in_fd, host.options().max_request_bytes);
  Session session(/*respond_with_delta=*/true);
  std::string out;
  out.reserve(2 * kFlushAt);
  bool open = true;
  auto flush = [&] {
    if (!out.empty() && open) open = write_all(o.out_fd, out);
    out.clear();
  };
  std::string_view line;
  for (;;) {
    const auto next = reader.next(line, flush);
    if (next == LineReader::Next::eof) break;
    if (next == LineReader::Next::too_large) {
      encode_response(host.request_too_large(), out);
    } else if (!is_blank(line)) {
      g_unsent_size.store(out.size(), std::memory_order_relaxed);
      g_unsent_data.store(out.data(), std::memory_order_relaxed);
      host.handle_json(line, session, out, {}, /*nul_terminated=*/true);
      g_unsent_data.store(nullptr, std::memory_order_relaxed);
    }
    if (out.size() >= kFlushAt) flush();
    if (!open) return 0;  // the reader went away; nobody is left to answer
  }
  flush();
  return 0;
}

/// Writes responses, holding back those without an id until every earlier request
/// has been answered.
class OrderedWriter {
 public:
  OrderedWriter(int fd, std::size_t window) : fd_(fd), window_(window) {}

  /// Blocks the reader while `window` requests are unanswered.
  void wait_for_room(std::uint64_t seq) {
    std::unique_lock lock(mu_);
    room_.wait(lock, [&] { return seq < next_ + window_; });
  }

  void emit(std::uint64_t seq, bool has_id, std::string text) {
    std::lock_guard lock(mu_);
    if (!has_id && seq != next_) {
      held_.emplace(seq, std::move(text));
      return;
    }
    write(text);
    mark_done(seq);
    while (true) {
      if (auto it = held_.find(next_); it != held_.end()) {
        write(it->second);
        held_.erase(it);
        ++next_;
      } else if (auto d = done_ahead_.find(next_); d != done_ahead_.end()) {
        done_ahead_.erase(d);
        ++next_;
      } else {
        break;
      }
    }
    room_.notify_all();
  }

  bool open() const {
    std::lock_guard lock(mu_);
    return open_;
  }

 private:
  void write(const std::string& text) {
    if (open_) open_ = write_all(fd_, text);
  }
  void mark_done(std::uint64_t seq) {
    if (seq == next_) ++next_;
    else done_ahead_.insert(seq);
  }

  int fd_;
  std::size_t window_;
  mutable std::mutex mu_;
  std::condition_variable room_;
  std::uint64_t next_ = 0;
  std::map<std::uint64_t, std::string> held_;
  std::set<std::uint64_t> done_ahead_;
  bool open_ = true;
};

struct Job {
  std::uint64_t seq;
  bool too_large;
  std::string line;
};

/// Bounded multi-consumer queue; close() lets consumers drain and stop.
class JobQueue {
 public:
  explicit JobQueue(std::size_t cap) : cap_(cap) {}
  void push(Job job) {
    std::unique_lock lock(mu_);
    not_full_.wait(lock, [&] { return q_.size() < cap_; });
    q_.push_back(std::move(job));
    not_empty_.notify_one();
  }
  std::optional<Job> pop() {
    std::unique_lock lock(mu_);
    not_empty_.wait(lock, [&] { return !q_.empty() || closed_; });
    if (q_.empty()) return std::nullopt;
    Job job = std::move(q_.front());
    q_.pop_front();
    not_full_.notify_one();
    return job;
  }
  void close() {
    std::lock_guard lock(mu_);
    closed_ = true;
    not_empty_.notify_all();
  }

 private:
  std::size_t cap_;
  std::mutex mu_;
  std::condition_variable not_empty_, not_full_;
  std::deque<Job> q_;
  bool closed_ = false;
};

int serve_workers(Host& host, const ServeOptions& o) {
  LineReader reader(o.in_fd, host.options().max_request_bytes);
  Session session(/*respond_with_delta=*/true);
  OrderedWriter writer(o.out_fd, o.max_in_flight);
  JobQueue queue(o.workers * 4);
  std::vector<std::thread> threads;
  for (unsigned i = 0; i < o.workers; ++i) {
    threads.emplace_back([&] {
      std::string out;
      while (auto job = queue.pop()) {
        out.clear();
        bool has_id = false;
        if (job->too_large) encode_response(host.request_too_large(), out);
        else has_id = host.handle_json(job->line, session, out, {}, /*nul_terminated=*/true);
        writer.emit(job->seq, has_id, std::move(out));
        out = std::string();
      }
    });
  }
  std::uint64_t seq = 0;
  std::string_view line;
  for (;;) {
    const auto next = reader.next(line, [] {});
    if (next == LineReader::Next::eof) break;
    const bool too_large = next == LineReader::Next::too_large;
    if (!too_large && is_blank(line)) continue;
    writer.wait_for_room(seq);
    if (!writer.open()) break;
    queue.push(Job{seq++, too_large, too_large ? std::string() : std::string(line)});
  }
  queue.close();
  for (auto& t : threads) t.join();
  return 0;
}

}  // namespace

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

int serve(Host& host, const ServeOptions& options) {
  return options.workers <= 1 ? serve_inline(host, options) : serve_workers(host, options);
}

int run_once(Host& host, std::string_view aid, int in_fd, int out_fd) {
  std::string body;
  std::string out;
  if (!read_all_bounded(in_fd, host.options().max_request_bytes, body)) {
    encode_response(host.request_too_large(), out);
  } else {
    Session session(/*respond_with_delta=*/false);
    host.handle_json(is_blank(body) ? std::string_view("{}") : std::string_view(body), session, out, aid,
                     /*nul_terminated=*/true);
  }
  write_all(out_fd, out);
  return 0;
}

}  // namespace machina::cli
