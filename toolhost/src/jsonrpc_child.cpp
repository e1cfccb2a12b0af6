// See jsonrpc_child.hpp.
#include <machina/host.hpp>
#include <machina/json_text.hpp>
#include <machina/jsonrpc_child.hpp>

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>

namespace machina {
namespace {

using Clock = std::chrono::steady_clock;

/// The id as we sent it (an integer), from the raw JSON an answer carries: 7 or "7".
bool id_of(std::string_view raw, std::int64_t& id) {
  if (raw.size() >= 2 && raw.front() == '"' && raw.back() == '"') raw = raw.substr(1, raw.size() - 2);
  const auto [end, ec] = std::from_chars(raw.data(), raw.data() + raw.size(), id);
  return ec == std::errc() && end == raw.data() + raw.size();
}

}  // namespace

JsonRpcChild::JsonRpcChild(JsonRpcChildOptions options, RequestHandler on_request, NotificationHandler on_notification,
                           Spawner* spawner)
    : options_(std::move(options)), on_request_(std::move(on_request)), on_notification_(std::move(on_notification)) {
  if (options_.argv.empty()) throw HostError("a JSON-RPC child needs a command");
  ChildSpec spec;
  spec.executable = options_.argv.front();
  spec.argv = options_.argv;
  spec.env = options_.env;
  spec.cwd = options_.cwd;
  spec.stdio = ChildSpec::Stdio::pipes;
  spec.tail_bytes = options_.stderr_tail_bytes;
  child_ = std::make_unique<ChildProcess>(spec, spawner);
  child_->drain_in_background();
  reader_ = std::thread([this] { read_loop(); });
}

JsonRpcChild::~JsonRpcChild() {
  child_->kill();
  if (reader_.joinable()) reader_.join();
  std::lock_guard lock(mu_);
  fail_all(Reply::Ending::closed, "the child was closed");
}

void JsonRpcChild::fail_all(Reply::Ending ending, const std::string& why) {
  gone_ = true;
  for (auto& [id, p] : pending_) {
    p->done = true;
    p->reply.ending = ending;
    p->reply.message = why;
    p->cv.notify_all();
  }
  pending_.clear();
}

bool JsonRpcChild::write_line(std::string_view line, std::int64_t deadline_ms) {
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

bool JsonRpcChild::notify(std::string_view method, std::string_view params) {
  {
    std::lock_guard lock(mu_);
    if (gone_) return false;
  }
  std::string line;
  jsonrpc::append_notification(line, method, params);
  return write_line(line, steady_now_ms() + 5000);
}

JsonRpcChild::Reply JsonRpcChild::call(std::string_view method, std::string_view params, std::int64_t deadline_ms,
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
      std::lock_guard lock(mu_);
      if (p->done) return;
      pending_.erase(id);
      p->done = true;
      p->reply.ending = Reply::Ending::cancelled;
      p->reply.message = "cancelled by its caller";
      p->cv.notify_all();
    });
  }
  std::unique_lock lock(mu_);
  const auto until = Clock::time_point(std::chrono::milliseconds(deadline_ms));
  while (!p->done) {
    if (p->cv.wait_until(lock, until) == std::cv_status::timeout && !p->done && steady_now_ms() >= deadline_ms) {
      pending_.erase(id);
      p->done = true;
      p->reply.ending = Reply::Ending::timed_out;
      p->reply.message = "no answer before the deadline";
    }
  }
  Reply reply = p->reply;
  lock.unlock();
  if (cancel != nullptr) cancel->on_cancel(nullptr);
  return reply;
}

void JsonRpcChild::kill(const std::string& why) {
  child_->kill();
  std::lock_guard lock(mu_);
  if (how_.empty()) how_ = why;
  fail_all(Reply::Ending::crashed, why);
}

void JsonRpcChild::finish(std::int64_t grace_ms) {
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

bool JsonRpcChild::alive() const {
  std::lock_guard lock(mu_);
  return !gone_;
}

std::size_t JsonRpcChild::in_flight() const {
  std::lock_guard lock(mu_);
  return pending_.size();
}

std::string JsonRpcChild::ended_how() const {
  std::lock_guard lock(mu_);
  return how_;
}

void JsonRpcChild::read_loop() {
  const int fd = child_->stdout_fd();
  std::string buffer;
  char chunk[64 * 1024];
  std::string why;
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      pollfd p{fd, POLLIN, 0};
      ::poll(&p, 1, -1);
      continue;
    }
    if (n <= 0) break;
    buffer.append(chunk, static_cast<std::size_t>(n));
    std::size_t at = 0;
    for (std::size_t nl; (nl = buffer.find('\n', at)) != std::string::npos; at = nl + 1) {
      std::string_view line(buffer.data() + at, nl - at);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
      jsonrpc::Message m;
      if (!jsonrpc::parse(line, m, why) || m.kind == jsonrpc::Message::Kind::invalid) {
        const std::string what = m.kind == jsonrpc::Message::Kind::invalid && why.empty() ? m.why : why;
        kill("wrote something that is not JSON-RPC (" + what + "): " + excerpt(line));
        buffer.clear();
        at = 0;
        break;
      }
      if (m.kind == jsonrpc::Message::Kind::request) {
        std::string reply;
        on_request_(m, reply);
        if (!write_line(reply, steady_now_ms() + 5000)) break;
      } else if (m.kind == jsonrpc::Message::Kind::notification) {
        on_notification_(m);
      } else {
        std::int64_t id = 0;
        if (!id_of(m.id, id)) continue;  // an answer to nothing we sent (a null id): dropped
        std::lock_guard lock(mu_);
        auto it = pending_.find(id);
        if (it == pending_.end()) continue;  // late: its call gave up already
        auto p = std::move(it->second);
        pending_.erase(it);
        p->done = true;
        if (m.kind == jsonrpc::Message::Kind::result) {
          p->reply.ending = Reply::Ending::result;
          p->reply.result.assign(m.result);
        } else {
          p->reply.ending = Reply::Ending::error;
          p->reply.code = m.error_code;
          p->reply.message = std::move(m.error_message);
          p->reply.data.assign(m.error_data);
        }
        p->cv.notify_all();
      }
    }
    buffer.erase(0, at);
    if (buffer.size() > options_.max_line_bytes) {
      kill("wrote a message over " + std::to_string(options_.max_line_bytes) + " bytes");
      buffer.clear();
    }
  }
  // Ended: how, and the last of what it wrote to stderr.
  const std::string how = child_->end(200);
  std::string tail = child_->tail();
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == ' ')) tail.pop_back();
  std::lock_guard lock(mu_);
  if (how_.empty()) how_ = how + (tail.empty() ? "" : "; stderr: " + tail);
  fail_all(Reply::Ending::crashed, how_);
}

}  // namespace machina
