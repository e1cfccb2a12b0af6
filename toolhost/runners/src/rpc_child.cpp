// See rpc_child.hpp.
#include <machina/clock.hpp>
#include <machina/json_text.hpp>
#include <machina/rpc_child.hpp>

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>

namespace machina {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kChunkBytes = 64 * 1024;
// How long the reading turn stays free before the watch thread takes it: calls made back
// to back keep it among the callers; the child's output between calls waits at most this.
constexpr auto kIdleTakeover = std::chrono::milliseconds(2);
// How often the watch thread looks while a caller holds the turn (it takes the turn no
// sooner than kIdleTakeover after it is given up, and no later than this).
constexpr auto kWatchWhileCallersRead = std::chrono::milliseconds(50);
// Answers to no request in flight told one by one; past these, one in a thousand.
constexpr std::uint64_t kStrayAnswersTold = 10;

/// The id as we sent it (an integer), from the raw JSON an answer carries: 7 or "7".
bool id_of(std::string_view raw, std::int64_t& id) {
  if (raw.size() >= 2 && raw.front() == '"' && raw.back() == '"') raw = raw.substr(1, raw.size() - 2);
  const auto [end, ec] = std::from_chars(raw.data(), raw.data() + raw.size(), id);
  return ec == std::errc() && end == raw.data() + raw.size();
}

}  // namespace

RpcChild::RpcChild(RpcChildOptions options, RequestHandler on_request, NotificationHandler on_notification,
                   Spawner* spawner)
    : options_(std::move(options)),
      on_request_(std::move(on_request)),
      on_notification_(std::move(on_notification)),
      chunk_(new char[kChunkBytes]) {
  if (options_.argv.empty()) throw ConfigError("a JSON-RPC child needs a command");
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throw ConfigError(std::string("cannot make an eventfd: ") + std::strerror(errno));
  ChildSpec spec;
  spec.executable = options_.argv.front();
  spec.argv = options_.argv;
  spec.env = options_.env;
  spec.cwd = options_.cwd;
  spec.stdio = ChildSpec::Stdio::pipes;
  spec.tail_bytes = options_.stderr_tail_bytes;
  try {
    child_ = std::make_unique<ChildProcess>(spec, spawner);
  } catch (...) {
    ::close(wake_fd_);
    throw;
  }
  child_->drain_in_background();
  try {
    watch_ = std::thread([this] { watch(); });
  } catch (...) {
    child_->kill();
    ::close(wake_fd_);
    throw;
  }
}

RpcChild::~RpcChild() {
  child_->kill();
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  watch_cv_.notify_all();
  wake_reader();
  if (watch_.joinable()) watch_.join();
  {
    std::lock_guard lock(mu_);
    fail_all(Reply::Ending::closed, "the child was closed");
  }
  ::close(wake_fd_);
}

void RpcChild::fail_all(Reply::Ending ending, const std::string& why) {
  gone_ = true;
  for (auto& [id, p] : pending_) {
    p->done = true;
    p->reply.ending = ending;
    p->reply.message = why;
    p->cv.notify_all();
  }
  pending_.clear();
  watch_cv_.notify_all();
  wake_reader();  // a caller reading returns at once (its child's end may come late, or never)
}

void RpcChild::wake_reader() const {
  const std::uint64_t one = 1;
  [[maybe_unused]] const auto n = ::write(wake_fd_, &one, sizeof one);
}

bool RpcChild::write_line(std::string_view line, std::int64_t deadline_ms) {
  std::lock_guard lock(write_mu_);
  std::size_t sent = 0;
  while (sent < line.size()) {
    const ssize_t n = write_quietly(child_->input_fd(), line.data() + sent, line.size() - sent);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN) return false;
    const std::int64_t left = deadline_ms - steady_now_ms();
    if (left <= 0) {
      // Part of a line on its input: nothing more can be said to it.
      if (sent > 0) child_->kill();
      return false;
    }
    pollfd p{child_->input_fd(), POLLOUT, 0};
    ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left, 1 << 30)));
  }
  return true;
}

bool RpcChild::notify(std::string_view method, std::string_view params) {
  {
    std::lock_guard lock(mu_);
    if (gone_) return false;
  }
  std::string line;
  jsonrpc::append_notification(line, method, params);
  return write_line(line, steady_now_ms() + 5000);
}

std::shared_ptr<RpcChild::Pending> RpcChild::next_reader() const {
  for (const auto& [id, p] : pending_) {
    if (!p->done && p->waiting) return p;
  }
  return nullptr;
}

RpcChild::Reply RpcChild::call(std::string_view method, std::string_view params, std::int64_t deadline_ms,
                               CancelToken* cancel, const std::function<void(std::int64_t)>& sent) {
  auto p = std::make_shared<Pending>();
  std::int64_t id = 0;
  {
    std::lock_guard lock(mu_);
    if (gone_) {
      Reply r;
      r.ending = Reply::Ending::crashed;
      r.message = how_.empty() ? "the child has ended" : how_;
      return r;
    }
    id = next_id_++;
    // What the child wrote before now cannot answer this request.
    p->sent_after = bytes_read_.load(std::memory_order_acquire);
    pending_.emplace(id, p);
  }
  // Known to the owner before the child can see it (its requests about the call may come
  // back at once).
  if (sent) sent(id);
  std::string line;
  jsonrpc::append_request(line, std::to_string(id), method, params);
  if (!write_line(line, deadline_ms)) {
    std::lock_guard lock(mu_);
    if (!p->done) {
      pending_.erase(id);
      p->done = true;
      p->reply.ending = steady_now_ms() >= deadline_ms ? Reply::Ending::timed_out : Reply::Ending::crashed;
      p->reply.message = p->reply.ending == Reply::Ending::timed_out
                             ? "the request could not be written before the deadline"
                             : "the child's input is closed";
    }
    return p->reply;
  }
  if (cancel != nullptr) {
    cancel->on_cancel([this, id, p] {
      {
        std::lock_guard lock(mu_);
        if (p->done) return;
        pending_.erase(id);
        p->done = true;
        p->reply.ending = Reply::Ending::cancelled;
        p->reply.message = "cancelled by its caller";
        // (Under the lock: once it is released, the caller may return and the owner
        // destroy this object.)
        wake_reader();  // its thread may be the one reading
      }
      p->cv.notify_all();
    });
  }
  const auto until = Clock::time_point(std::chrono::milliseconds(deadline_ms));
  std::unique_lock lock(mu_);
  while (!p->done) {
    const std::int64_t left = deadline_ms - steady_now_ms();
    if (left <= 0) {
      pending_.erase(id);
      p->done = true;
      p->reply.ending = Reply::Ending::timed_out;
      p->reply.message = "no answer before the deadline";
      break;
    }
    if (!reading_ && !gone_ && !watch_wanted_) {
      // The turn is free: this thread reads, for every call in flight.
      reading_ = true;
      lock.unlock();
      const Read next = read_some(static_cast<int>(std::min<std::int64_t>(left, 1 << 30)), p.get(), deadline_ms);
      lock.lock();
      reading_ = false;
      turn_free_since_ = Clock::now();
      if (next == Read::for_watch) {
        watch_wanted_ = true;
        watch_cv_.notify_one();
      }
      continue;
    }
    if (watch_reading_ && !watch_woken_) {
      watch_woken_ = true;
      wake_reader();  // the watch thread gives the turn up
    }
    p->waiting = true;
    p->cv.wait_until(lock, until);
    p->waiting = false;
  }
  Reply reply = p->reply;
  // Leaving with the turn free: the next caller waiting for its answer reads now.
  std::shared_ptr<Pending> next = reading_ || gone_ ? nullptr : next_reader();
  lock.unlock();
  if (next) next->cv.notify_all();
  if (cancel != nullptr) cancel->on_cancel(nullptr);
  return reply;
}

void RpcChild::kill(const std::string& why) {
  child_->kill();
  std::lock_guard lock(mu_);
  if (how_.empty()) how_ = why;
  fail_all(Reply::Ending::crashed, why);
}

void RpcChild::finish(std::int64_t grace_ms) {
  {
    // Said first: the reader may see the child leave before this thread is back.
    std::lock_guard lock(mu_);
    if (how_.empty()) how_ = "it was closed";
  }
  {
    std::lock_guard lock(write_mu_);
    child_->close_input();
  }
  child_->wait_exit(std::chrono::milliseconds(std::max<std::int64_t>(grace_ms, 0)));
  kill("it was closed");
}

bool RpcChild::alive() const {
  std::lock_guard lock(mu_);
  return !gone_;
}

std::size_t RpcChild::in_flight() const {
  std::lock_guard lock(mu_);
  return pending_.size();
}

std::uint64_t RpcChild::answers_read_by_callers() const {
  std::lock_guard lock(mu_);
  return answers_read_by_callers_;
}

std::uint64_t RpcChild::stray_answers() const {
  std::lock_guard lock(mu_);
  return stray_answers_;
}

void RpcChild::stray_answer(std::int64_t id, std::uint64_t count) const {
  if (!options_.on_event || (count > kStrayAnswersTold && count % 1000 != 0)) return;
  options_.on_event(options_.name + ": dropped an answer for id " + std::to_string(id) +
                    ", which is not a request in flight (" + std::to_string(count) + " dropped" +
                    (count == kStrayAnswersTold ? "; from here on one in a thousand is told)" : ")"));
}

std::string RpcChild::ended_how() const {
  std::lock_guard lock(mu_);
  return how_;
}

void RpcChild::watch() {
  std::unique_lock lock(mu_);
  // (After the child is gone it still reads, up to the end of the output: then the child
  // is reaped at once and its end described.)
  while (!ended_ && !stopping_) {
    if (reading_) {
      watch_cv_.wait_for(lock, kWatchWhileCallersRead);
      continue;
    }
    if (!gone_ && !watch_wanted_ && Clock::now() - turn_free_since_ < kIdleTakeover) {
      watch_cv_.wait_for(lock, kIdleTakeover);
      continue;
    }
    watch_wanted_ = false;
    reading_ = watch_reading_ = true;
    lock.unlock();
    read_some(-1, nullptr, 0);
    lock.lock();
    reading_ = watch_reading_ = watch_woken_ = false;
    turn_free_since_ = Clock::now();
    if (auto next = next_reader()) {
      lock.unlock();
      next->cv.notify_all();
      lock.lock();
    }
  }
}

RpcChild::Read RpcChild::read_some(int timeout_ms, const Pending* mine, std::int64_t deadline_ms) noexcept {
  try {
    // Whole lines a reader before left (it stopped once its own answer was in) come first.
    if (buffer_.find('\n', clean_) == std::string::npos) {
      clean_ = buffer_.size();
      const int fd = child_->stdout_fd();
      pollfd fds[2] = {{fd, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      if (::poll(fds, 2, timeout_ms) <= 0) return Read::more;  // (the caller looks at its deadline)
      if (fds[1].revents != 0) {
        std::uint64_t count;
        [[maybe_unused]] const auto n = ::read(wake_fd_, &count, sizeof count);
      }
      if (fds[0].revents == 0) return Read::more;
      for (;;) {
        const ssize_t n = ::read(fd, chunk_.get(), kChunkBytes);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) break;
        if (n <= 0) {
          // (Its end is the watch thread's to describe, which may take a while.)
          if (mine != nullptr) return Read::for_watch;
          ended();
          return Read::more;
        }
        buffer_.append(chunk_.get(), static_cast<std::size_t>(n));
        bytes_read_.fetch_add(static_cast<std::uint64_t>(n), std::memory_order_release);
        if (static_cast<std::size_t>(n) < kChunkBytes) break;  // (a pipe gives what it holds: drained)
        if (buffer_.size() > options_.max_line_bytes) break;
      }
    }
    std::size_t at = 0;
    Read next = Read::more;
    bool stopped = false;  // with lines left
    // (The first line ends past clean_: a long message read in many chunks is searched once.)
    for (std::size_t nl; (nl = buffer_.find('\n', at == 0 ? clean_ : at)) != std::string::npos;) {
      std::string_view line(buffer_.data() + at, nl - at);
      const std::size_t line_start = at;
      at = nl + 1;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      const std::size_t lead = line.find_first_not_of(" \t");
      if (lead == std::string_view::npos) continue;
      const Handled handled = handle_line(line, mine != nullptr, buffer_at_ + line_start + lead);
      if (handled == Handled::killed) {
        buffer_at_ += buffer_.size();
        buffer_.clear();
        clean_ = 0;
        return Read::more;  // (its end is read next)
      }
      if (handled == Handled::for_watch) {
        // A request or notification of the child's: answered by the watch thread, so that a
        // slow answer holds up no caller past its deadline.
        at = line_start;
        next = Read::for_watch;
        stopped = true;
        break;
      }
      // A caller does not serve the others past its own answer, cancellation or deadline:
      // what is left stays for the next reader.
      if (mine != nullptr && (mine->done.load(std::memory_order_relaxed) || steady_now_ms() >= deadline_ms)) {
        stopped = true;
        break;
      }
    }
    buffer_.erase(0, at);
    buffer_at_ += at;
    clean_ = stopped ? 0 : buffer_.size();  // (searched to its end: no newline left)
    if (buffer_.size() > options_.max_line_bytes && clean_ == buffer_.size()) {
      kill("wrote a message over " + std::to_string(options_.max_line_bytes) + " bytes");
      buffer_at_ += buffer_.size();
      buffer_.clear();
      clean_ = 0;
    }
    return next;
  } catch (const std::exception& e) {
    // (Out of memory, say.) Nothing of the exchange can be trusted any more.
    buffer_at_ += buffer_.size();
    buffer_.clear();
    clean_ = 0;
    kill(std::string("its output could not be handled (") + e.what() + ")");
  }
  return Read::more;
}

RpcChild::Handled RpcChild::handle_line(std::string_view line, bool by_caller, std::uint64_t at) {
  jsonrpc::Message m;
  std::string why;
  if (!jsonrpc::parse(line, m, why) || m.kind == jsonrpc::Message::Kind::invalid) {
    const std::string what = m.kind == jsonrpc::Message::Kind::invalid && why.empty() ? m.why : why;
    kill("wrote something that is not JSON-RPC (" + what + "): " + excerpt(line));
    return Handled::killed;
  }
  if (by_caller && (m.kind == jsonrpc::Message::Kind::request || m.kind == jsonrpc::Message::Kind::notification)) {
    return Handled::for_watch;
  }
  if (m.kind == jsonrpc::Message::Kind::request) {
    std::string reply;
    try {
      on_request_(m, reply);
    } catch (const std::exception&) {
      // The host's answer failed (a method name that is not UTF-8, say): the child hears so.
      reply.clear();
      jsonrpc::append_error(reply, m.id, jsonrpc::kInternalError, "the host could not answer this request");
    }
    if (!write_line(reply, steady_now_ms() + 5000)) {
      kill("does not read its input (a reply to its request could not be written)");
      return Handled::killed;
    }
  } else if (m.kind == jsonrpc::Message::Kind::notification) {
    try {
      on_notification_(m);
    } catch (const std::exception&) {
      // (a notification is only news: one that cannot be passed on is dropped)
    }
  } else {
    std::int64_t id = 0;
    if (!id_of(m.id, id)) return Handled::done;  // an answer to nothing we sent (a null id): dropped
    std::shared_ptr<Pending> p;
    std::uint64_t stray = 0;
    {
      std::lock_guard lock(mu_);
      auto it = pending_.find(id);
      // An id not given out yet, or one whose request was not yet written when the child
      // began this line (left unread, or unfinished, until the request went): not its answer.
      if (id < 1 || id >= next_id_ || (it != pending_.end() && at < it->second->sent_after)) {
        stray = ++stray_answers_;
      } else if (it == pending_.end()) {
        return Handled::done;  // late: its call gave up already
      } else {
        p = std::move(it->second);
        pending_.erase(it);
        if (m.kind == jsonrpc::Message::Kind::result) {
          p->reply.ending = Reply::Ending::result;
          p->reply.result.assign(m.result);
        } else {
          p->reply.ending = Reply::Ending::error;
          p->reply.code = m.error_code;
          p->reply.message = std::move(m.error_message);
          p->reply.data.assign(m.error_data);
        }
        p->done = true;
        if (by_caller) ++answers_read_by_callers_;
      }
    }
    if (stray != 0) {
      stray_answer(id, stray);
      return Handled::done;
    }
    // Told once the lock is free: woken under it, the caller would only wait for it
    // again (two more thread switches a call on one CPU).
    p->cv.notify_all();
  }
  return Handled::done;
}

void RpcChild::ended() {
  // How it ended, and the last of what it wrote to stderr.
  const std::string how = child_->end(200);
  std::string tail = child_->tail();
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == ' ')) tail.pop_back();
  std::lock_guard lock(mu_);
  if (how_.empty()) how_ = how + (tail.empty() ? "" : "; stderr: " + tail);
  ended_ = true;
  fail_all(Reply::Ending::crashed, how_);
}

}  // namespace machina
