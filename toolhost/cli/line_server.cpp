// See line_server.hpp.
#include "line_server.hpp"

#include "line_reader.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
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
  (void)write_all(g_wire_fd, std::string_view(data, size));
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
    struct sigaction sa{};
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

/// The ds_state one serving thread handles a line with: the stream's, or with
/// state_per_call one that starts empty for every line (each thread has its own, so a
/// thread left in a stuck tool keeps the one its call runs with).
class StreamState {
 public:
  StreamState(CallerState& stream, bool per_call) : stream_(stream), per_call_(per_call) {
    if (per_call_) own_.emplace(/*respond_with_delta=*/true);
  }
  CallerState& get() { return per_call_ ? *own_ : stream_; }
  /// After a line: what it left behind does not reach the next.
  void done() {
    if (per_call_ && !own_->empty()) own_.emplace(/*respond_with_delta=*/true);
  }

 private:
  CallerState& stream_;
  bool per_call_;
  std::optional<CallerState> own_;
};

/// --serve without --workers: one thread reads, runs and answers, batching output until
/// it would block. If a tool overruns its deadline on that thread, the host's watchdog
/// answers `timeout` through deliver(), which writes what was pending and starts a
/// new thread that carries on reading; the stuck thread leaves quietly when it returns.
class InlineServer final : public OverrunSink {
 public:
  InlineServer(Host& host, LineCodec& codec, const ServeOptions& o)
      : host_(host),
        codec_(codec),
        o_(o),
        reader_(o.in_fd, host.options().max_request_bytes, o.spin),
        session_(true),
        wire_(o.out_fd) {
    out_.reserve(2 * kFlushAt);
    codec_.attach([this](std::string_view lines) { wire_.write(lines); });
  }

  int run() {
    install_unsent_handlers(o_.out_fd);
    threads_.start([this] { serve(); });
    threads_.wait_all();
    return 0;
  }

  void deliver(Response response) override {
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
    StreamState session(session_, o_.state_per_call);
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
        if (handled.overran) {
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
  CallerState session_;
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
    if (seq == next_)
      ++next_;
    else
      done_ahead_.insert(seq);
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

/// --serve --workers N (and the JSON-RPC fronts): N calls at once, on N + 1 threads that take
/// turns reading (leader and followers). The thread that reads a line runs its call itself,
/// having first handed the reading to another, so a call costs no hand-over between threads
/// and the input is read while calls run (a cancellation reaches them). With N calls
/// running, lines read wait in order for the first thread to come free. A thread lost to a
/// stuck tool has its call answered through deliver() and is replaced.
class WorkerServer {
 public:
  WorkerServer(Host& host, LineCodec& codec, const ServeOptions& o)
      : host_(host),
        codec_(codec),
        o_(o),
        session_(true),
        wire_(o.out_fd),
        writer_(wire_, o.max_in_flight),
        reader_(o.in_fd, host.options().max_request_bytes, o.spin) {
    codec_.attach([this](std::string_view lines) { wire_.write(lines); });
  }

  int run() {
    for (unsigned i = 0; i <= o_.workers; ++i) threads_.start([this] { work(); });
    threads_.wait_all();
    return 0;
  }

 private:
  struct JobOverrunSink final : OverrunSink {
    WorkerServer* server;
    std::uint64_t seq;
    JobOverrunSink(WorkerServer* s, std::uint64_t n) : server(s), seq(n) {}
    void deliver(Response response) override {
      std::string text;
      server->codec_.encode(response, text);
      server->writer_.emit(seq, !response.id_json.empty(), std::move(text));
      {
        std::lock_guard lock(server->mu_);
        --server->busy_;  // its thread stays in the tool: a new one serves in its place
      }
      server->threads_.start([s = server] { s->work(); });  // before lost(): the count never touches 0
      server->threads_.lost();
    }
  };

  /// Reads the next line to run (this thread being the one reading); false at the end.
  bool read_job(Job& job) {
    std::string_view line;
    for (;;) {
      const auto next = reader_.next(line, [] {});
      if (next == LineReader::Next::eof) return false;
      const bool too_large = next == LineReader::Next::too_large;
      if (!too_large && is_blank(line)) continue;
      // Read while earlier lines' calls run: a cancellation reaches them.
      const auto peek = too_large ? LineCodec::Peek::handle : codec_.peek(line);
      if (peek == LineCodec::Peek::done) continue;
      writer_.wait_for_room(seq_);
      if (!writer_.open()) return false;
      job = Job{seq_++, too_large, std::string(line)};
      if (peek == LineCodec::Peek::handle_then_stop) stop_after_ = true;
      return true;
    }
  }

  void work() {
    using Clock = std::chrono::steady_clock;
    std::string out;
    StreamState session(session_, o_.state_per_call);
    std::unique_lock lock(mu_);
    for (;;) {
      Job job;
      const auto now = Clock::now();
      if (!waiting_.empty() && busy_ < o_.workers) {
        if (waiting_.size() == max_waiting()) turn_.notify_one();  // room again: reading may go on
        job = std::move(waiting_.front());
        waiting_.pop_front();
      } else if (!reading_ && !ended_ && waiting_.size() < max_waiting() &&
                 (!unattended_ || now >= unattended_at_ + kTakeOver)) {
        // This thread reads (taking over from a call left unattended past kTakeOver).
        if (unattended_) standby_poll_ = kStandbyPollMin;  // calls outlast kTakeOver: look often again
        unattended_ = false;
        reading_ = true;
        lock.unlock();
        const bool got = read_job(job);
        lock.lock();
        reading_ = false;
        last_read_ = Clock::now();
        if (!got || stop_after_) ended_ = true;
        if (ended_) {  // (at the end: all leave)
          turn_.notify_all();
          standby_cv_.notify_all();
        }
        if (!got) continue;
        if (busy_ >= o_.workers) {  // every call slot taken: it waits its turn (bounded: max_waiting)
          waiting_.push_back(std::move(job));
          continue;
        }
        const bool alone = busy_ == 0 && waiting_.empty();
        ++busy_;
        if (alone && !ended_) {
          // Nothing else in flight: run it without handing the reading on (a wake-up of
          // another thread costs more than most calls); the standby takes the reading over
          // if the call lasts past kTakeOver.
          unattended_ = true;
          unattended_at_ = last_read_;
          const std::uint64_t mine = ++unattended_serial_;
          if (standby_idle_) standby_cv_.notify_one();
          lock.unlock();
          if (!run_job(job, out, session)) return;
          lock.lock();
          --busy_;
          if (unattended_ && unattended_serial_ == mine) unattended_ = false;  // not taken over: it reads on
          continue;
        }
        lock.unlock();
        if (!ended_) turn_.notify_one();  // another thread reads now
        if (!run_job(job, out, session)) return;
        lock.lock();
        --busy_;
        continue;
      } else if (ended_ && waiting_.empty()) {
        turn_.notify_all();  // (those asleep leave too)
        standby_cv_.notify_all();
        return;
      } else if (!standby_ && !ended_) {
        // The standby: awake every kStandbyPoll while requests come, so that it sees a
        // call left unattended; asleep when they stop, woken by the next one.
        standby_ = true;
        if (unattended_) {
          standby_cv_.wait_until(lock, unattended_at_ + kTakeOver);
        } else if (now - last_read_ < kActive) {
          // Each look that finds nothing to take over makes the next one later: a wake-up
          // costs a lone caller's thread its CPU when it has only one (seen in p99).
          standby_cv_.wait_for(lock, standby_poll_);
          standby_poll_ = std::min(standby_poll_ * 2, kStandbyPollMax);
        } else {
          standby_idle_ = true;
          standby_cv_.wait(lock);
          standby_idle_ = false;
        }
        standby_ = false;
        continue;
      } else {
        turn_.wait(lock);
        continue;
      }
      ++busy_;
      lock.unlock();
      if (!run_job(job, out, session)) return;
      lock.lock();
      --busy_;  // (this thread takes what waits, or reads, or sleeps: nobody else need wake)
    }
  }

  /// Lines read ahead while every call slot is taken (then reading stops, as memory would
  /// otherwise hold up to the request window's lines).
  std::size_t max_waiting() const { return std::size_t{o_.workers} * 4; }

  /// Runs one line's call and writes its answer; false if the thread was lost to a stuck
  /// tool (it must leave: another serves in its place).
  bool run_job(Job& job, std::string& out, StreamState& session) {
    out.clear();
    LineCodec::Handled handled;
    if (job.too_large) {
      codec_.answer_too_large(host_, job.line, out);
    } else {
      JobOverrunSink overrun_sink(this, job.seq);
      handled = codec_.handle(host_, job.line, session.get(), out, &overrun_sink);
      if (handled.overran) {
        threads_.came_back();  // balanced when this thread ends
        return false;
      }
      session.done();
    }
    writer_.emit(job.seq, handled.has_id, std::move(out));
    out = std::string();
    return true;
  }

  Host& host_;
  LineCodec& codec_;
  const ServeOptions& o_;
  CallerState session_;
  Wire wire_;
  OrderedWriter writer_;
  LineReader reader_;        // used by the one thread reading
  std::uint64_t seq_ = 0;    // (the reading thread's)
  bool stop_after_ = false;  // (the reading thread's) a line said to read no further
  // A call left unattended (run by the thread that read it, nobody reading) is taken over
  // once it has run kTakeOver; the standby looks every kStandbyPollMin while requests
  // come, up to every kStandbyPollMax while it finds nothing to take over, and sleeps once
  // none has come for kActive.
  static constexpr std::chrono::microseconds kTakeOver{200};
  static constexpr std::chrono::milliseconds kStandbyPollMin{1};
  static constexpr std::chrono::milliseconds kStandbyPollMax{8};
  static constexpr std::chrono::milliseconds kActive{100};
  std::chrono::milliseconds standby_poll_ = kStandbyPollMin;  // (under mu_)
  std::mutex mu_;
  std::condition_variable turn_;        // followers
  std::condition_variable standby_cv_;  // the standby
  bool standby_ = false;                // a thread stands by
  bool standby_idle_ = false;           // ... asleep until woken
  bool unattended_ = false;             // nobody reads: the reader runs a call (since unattended_at_)
  std::chrono::steady_clock::time_point unattended_at_{}, last_read_{};
  std::uint64_t unattended_serial_ = 0;  // which run left it so
  bool reading_ = false;                 // a thread is reading
  bool ended_ = false;                   // nothing more will be read
  unsigned busy_ = 0;                    // calls running
  std::deque<Job> waiting_;              // read, waiting for a call slot
  ServingThreads threads_;
};

int serve_workers(Host& host, LineCodec& codec, const ServeOptions& o) {
  WorkerServer server(host, codec, o);
  return server.run();
}

}  // namespace

int serve(Host& host, LineCodec& codec, const ServeOptions& options) {
  return options.workers <= 1 ? serve_inline(host, codec, options) : serve_workers(host, codec, options);
}

}  // namespace machina::cli
