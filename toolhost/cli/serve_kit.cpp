// See serve_kit.hpp.
#include "serve_kit.hpp"

#include "line_reader.hpp"

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

/// The output: every write of whole lines goes through here, so that out-of-band lines
/// (LineCodec::WriteNow) never land inside a batch of responses.
class Wire {
 public:
  explicit Wire(int fd) : fd_(fd) {}
  bool write(std::string_view data) {
    std::lock_guard lock(mu_);
    if (!open_) return false;
    open_ = write_all(fd_, data);
    return open_;
  }

 private:
  int fd_;
  std::mutex mu_;
  bool open_ = true;
};

/// Threads that serve and may be lost to a stuck tool: detached, counted, and waited
/// for only while they are not stuck (a stuck one is replaced and forgotten).
class ServingThreads {
 public:
  template <class F>
  void start(F&& body) {
    {
      std::lock_guard lock(mu_);
      ++running_;
    }
    std::thread([this, body = std::forward<F>(body)]() mutable {
      body();
      std::lock_guard lock(mu_);
      --running_;
      done_.notify_all();
    }).detach();
  }
  /// A thread that will never come back to serve (its tool is stuck).
  void lost() {
    std::lock_guard lock(mu_);
    --running_;
    done_.notify_all();
  }
  /// Called by a thread that was lost and has now come back: it is done.
  void came_back() {
    std::lock_guard lock(mu_);
    ++running_;
  }
  void wait_all() {
    std::unique_lock lock(mu_);
    done_.wait(lock, [&] { return running_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable done_;
  int running_ = 0;
};

/// The session one serving thread handles a line in: the stream's, or with
/// state_per_call one that starts empty for every line (each thread has its own, so a
/// thread left in a stuck tool keeps the one its call runs with).
class LineSession {
 public:
  LineSession(Session& stream, bool per_call) : stream_(stream), per_call_(per_call) {
    if (per_call_) own_.emplace(/*respond_with_delta=*/true);
  }
  Session& get() { return per_call_ ? *own_ : stream_; }
  /// After a line: what it left behind does not reach the next.
  void done() {
    if (per_call_ && !own_->empty()) own_.emplace(/*respond_with_delta=*/true);
  }

 private:
  Session& stream_;
  bool per_call_;
  std::optional<Session> own_;
};

/// --serve without --workers: one thread reads, runs and answers, batching output until
/// it would block. If a tool overruns its deadline on that thread, the host's watchdog
/// answers `timeout` through deliver_overrun(), which writes what was pending and starts a
/// new thread that carries on reading; the stuck thread leaves quietly when it returns.
class InlineServer final : public Takeover {
 public:
  InlineServer(Host& host, LineCodec& codec, const ServeOptions& o)
      : host_(host), codec_(codec), o_(o), reader_(o.in_fd, host.options().max_request_bytes, o.spin),
        session_(true), wire_(o.out_fd) {
    out_.reserve(2 * kFlushAt);
    codec_.attach([this](std::string_view lines) { wire_.write(lines); });
  }

  int run() {
    install_unsent_handlers(o_.out_fd);
    threads_.start([this] { serve(); });
    threads_.wait_all();
    return 0;
  }

  void deliver_overrun(Response response) override {
    // The serving thread is inside the tool and cannot touch the state until this
    // returns; after that it only leaves.
    g_unsent_data.store(nullptr, std::memory_order_relaxed);
    codec_.encode(response, out_);
    flush();
    threads_.start([this] { serve(); });  // before lost(): the count never touches 0
    threads_.lost();
  }

 private:
  void flush() {
    if (!out_.empty() && open_) open_ = wire_.write(out_);
    out_.clear();
  }

  void serve() {
    auto before_block = [this] { flush(); };
    LineSession session(session_, o_.state_per_call);
    std::string_view line;
    while (!stopped_) {
      const auto next = reader_.next(line, before_block);
      if (next == LineReader::Next::eof) break;
      auto peek = LineCodec::Peek::handle;
      if (next == LineReader::Next::too_large) {
        codec_.answer_too_large(host_, line, out_);
      } else if (!is_blank(line) && (peek = codec_.peek(line)) != LineCodec::Peek::done) {
        g_unsent_size.store(out_.size(), std::memory_order_relaxed);
        g_unsent_data.store(out_.data(), std::memory_order_relaxed);
        const auto handled = codec_.handle(host_, line, session.get(), out_, this);
        if (handled.abandoned) {
          threads_.came_back();  // balanced by the decrement when this thread ends
          return;
        }
        session.done();
        g_unsent_data.store(nullptr, std::memory_order_relaxed);
        if (peek == LineCodec::Peek::handle_then_stop) stopped_ = true;
      }
      // While a stuck tool may still bring the process down at any moment, nothing is
      // held back.
      if (out_.size() >= kFlushAt || host_.stuck_calls() > 0) flush();
      if (!open_) return;  // the reader went away; nobody is left to answer
    }
    flush();
  }

  Host& host_;
  LineCodec& codec_;
  const ServeOptions& o_;
  LineReader reader_;
  Session session_;
  Wire wire_;
  std::string out_;
  bool open_ = true;
  bool stopped_ = false;  // a line said to read no further
  ServingThreads threads_;
};

int serve_inline(Host& host, LineCodec& codec, const ServeOptions& o) {
  InlineServer server(host, codec, o);
  return server.run();
}

/// Writes responses, holding back those without an id until every earlier request
/// has been answered.
class OrderedWriter {
 public:
  OrderedWriter(Wire& wire, std::size_t window) : wire_(wire), window_(window) {}

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
    if (open_ && !text.empty()) open_ = wire_.write(text);
  }
  void mark_done(std::uint64_t seq) {
    if (seq == next_) ++next_;
    else done_ahead_.insert(seq);
  }

  Wire& wire_;
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
  std::string line;  // (too large: its head)
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

/// --serve --workers N: a reader thread feeds a bounded queue, N threads run calls. A
/// worker thread lost to a stuck tool has its call answered through deliver_overrun()
/// and is replaced, so N threads keep serving.
class WorkerServer {
 public:
  WorkerServer(Host& host, LineCodec& codec, const ServeOptions& o)
      : host_(host), codec_(codec), o_(o), session_(true), wire_(o.out_fd), writer_(wire_, o.max_in_flight),
        queue_(o.workers * 4) {
    codec_.attach([this](std::string_view lines) { wire_.write(lines); });
  }

  int run() {
    for (unsigned i = 0; i < o_.workers; ++i) threads_.start([this] { work(); });
    LineReader reader(o_.in_fd, host_.options().max_request_bytes, o_.spin);
    std::uint64_t seq = 0;
    std::string_view line;
    for (;;) {
      const auto next = reader.next(line, [] {});
      if (next == LineReader::Next::eof) break;
      const bool too_large = next == LineReader::Next::too_large;
      if (!too_large && is_blank(line)) continue;
      // Read while earlier lines' calls run: a cancellation reaches them.
      const auto peek = too_large ? LineCodec::Peek::handle : codec_.peek(line);
      if (peek == LineCodec::Peek::done) continue;
      writer_.wait_for_room(seq);
      if (!writer_.open()) break;
      queue_.push(Job{seq++, too_large, std::string(line)});
      if (peek == LineCodec::Peek::handle_then_stop) break;
    }
    queue_.close();
    threads_.wait_all();
    return 0;
  }

 private:
  struct JobTakeover final : Takeover {
    WorkerServer* server;
    std::uint64_t seq;
    JobTakeover(WorkerServer* s, std::uint64_t n) : server(s), seq(n) {}
    void deliver_overrun(Response response) override {
      std::string text;
      server->codec_.encode(response, text);
      server->writer_.emit(seq, !response.id_json.empty(), std::move(text));
      server->threads_.start([s = server] { s->work(); });  // before lost(): the count never touches 0
      server->threads_.lost();
    }
  };

  void work() {
    std::string out;
    LineSession session(session_, o_.state_per_call);
    while (auto job = queue_.pop()) {
      out.clear();
      LineCodec::Handled handled;
      if (job->too_large) {
        codec_.answer_too_large(host_, job->line, out);
      } else {
        JobTakeover takeover(this, job->seq);
        handled = codec_.handle(host_, job->line, session.get(), out, &takeover);
        if (handled.abandoned) {
          threads_.came_back();  // balanced when this thread ends
          return;
        }
        session.done();
      }
      writer_.emit(job->seq, handled.has_id, std::move(out));
      out = std::string();
    }
  }

  Host& host_;
  LineCodec& codec_;
  const ServeOptions& o_;
  Session session_;
  Wire wire_;
  OrderedWriter writer_;
  JobQueue queue_;
  ServingThreads threads_;
};

int serve_workers(Host& host, LineCodec& codec, const ServeOptions& o) {
  WorkerServer server(host, codec, o);
  return server.run();
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

int serve(Host& host, LineCodec& codec, const ServeOptions& options) {
  return options.workers <= 1 ? serve_inline(host, codec, options) : serve_workers(host, codec, options);
}

}  // namespace machina::cli
