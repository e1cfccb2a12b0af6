// The line server under a codec of its own: lines answered in order (or, with an id, as
// they finish), blank lines skipped, a peeked-away line unanswered, a line past the request
// cap answered from its head, reading stopped after a closing line, and no more lines
// read ahead than the in-flight window allows.
#include "../../toolhost/cli/line_reader.hpp"
#include "../../toolhost/cli/line_server.hpp"

#include <machina/tool_host.hpp>

#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace machina;

namespace {

/// Answers "did <line>" per line. A line may start with "id " (its answer may overtake
/// earlier ones) and then "sleep:N " (it takes N ms) or "after:X " (it waits, at most
/// 10 s, until line X is done). "cancel" is dealt with by peek() and "bye" is the last
/// line read. Every peek and every answer is logged in order.
class ToyCodec final : public cli::LineCodec {
 public:
  Handled handle(Host&, std::string_view line, CallerState&, std::string& out, OverrunSink*) override {
    Handled h;
    std::string_view rest = line;
    if (rest.starts_with("id ")) {
      h.has_id = true;
      rest.remove_prefix(3);
    }
    if (rest.starts_with("sleep:")) {
      const std::size_t space = rest.find(' ');
      const int ms = std::stoi(std::string(rest.substr(6, space - 6)));
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      rest.remove_prefix(space + 1);
    } else if (rest.starts_with("after:")) {
      const std::size_t space = rest.find(' ');
      const std::string awaited = "done " + std::string(rest.substr(6, space - 6));
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (at(awaited) == size() && std::chrono::steady_clock::now() < give_up)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      rest.remove_prefix(space + 1);
    }
    log("done " + std::string(rest));
    out.append("did ").append(rest).append("\n");
    return h;
  }
  void answer_too_large(Host&, std::string_view head, std::string& out) override {
    heads.emplace_back(head);
    out.append("too large\n");
  }
  void encode(const Response&, std::string& out) override { out.append("overran\n"); }
  Peek peek(std::string_view line) override {
    log("peek " + std::string(line.substr(line.rfind(' ') + 1)));
    if (line == "cancel") return Peek::done;
    if (line == "bye") return Peek::handle_then_stop;
    return Peek::handle;
  }
  void attach(WriteNow write_now) override { attached = static_cast<bool>(write_now); }

  /// Where `entry` is in the log (size() when it is not there).
  std::size_t at(const std::string& entry) {
    std::lock_guard lock(mu_);
    return static_cast<std::size_t>(std::find(events_.begin(), events_.end(), entry) - events_.begin());
  }
  std::size_t size() {
    std::lock_guard lock(mu_);
    return events_.size();
  }

  std::vector<std::string> heads;
  bool attached = false;

 private:
  void log(std::string event) {
    std::lock_guard lock(mu_);
    events_.push_back(std::move(event));
  }
  std::mutex mu_;
  std::vector<std::string> events_;
};

/// Serves `input` (written by a thread of its own, then closed) and returns the output.
std::string serve_text(const std::string& input, cli::LineCodec& codec, cli::ServeOptions serve,
                       std::size_t max_request_bytes = 4096) {
  HostOptions options;
  options.max_request_bytes = max_request_bytes;
  ToolHost tools(options);
  int in[2], out[2];
  REQUIRE(::pipe(in) == 0);
  REQUIRE(::pipe(out) == 0);
  std::thread writer([&] {
    CHECK(write_all(in[1], input));
    ::close(in[1]);
  });
  std::string written;
  std::thread reader([&] {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(out[0], buf, sizeof buf)) > 0) written.append(buf, static_cast<std::size_t>(n));
  });
  serve.in_fd = in[0];
  serve.out_fd = out[1];
  CHECK(cli::serve(tools.host(), codec, serve) == 0);
  ::close(in[0]);  // (a writer still blocked on a server that stopped reading gets EPIPE)
  ::close(out[1]);
  writer.join();
  reader.join();
  ::close(out[0]);
  return written;
}

}  // namespace

TEST_CASE("lines in order, blank and peeked-away lines unanswered, an oversized line answered from its head") {
  for (unsigned workers : {1u, 3u}) {
    CAPTURE(workers);
    ToyCodec codec;
    cli::ServeOptions serve;
    serve.workers = workers;
    const std::string big(5000, 'x');
    const std::string written = serve_text("a\n\n  \ncancel\n" + big + "\nsleep:50 b\nc\n", codec, serve, 200);
    CHECK(written == "did a\ntoo large\ndid b\ndid c\n");
    REQUIRE(codec.heads.size() == 1);
    CHECK(codec.heads[0].starts_with("xxxx"));
    CHECK(codec.heads[0].size() <= cli::LineReader::kHeadBytes);  // the rest is never kept
    CHECK(codec.attached);
    CHECK(codec.at("peek cancel") < codec.at("peek b"));  // seen, and never answered
  }
}

TEST_CASE("a closing line is answered and nothing after it is read") {
  for (unsigned workers : {1u, 2u}) {
    CAPTURE(workers);
    ToyCodec codec;
    cli::ServeOptions serve;
    serve.workers = workers;
    CHECK(serve_text("a\nbye\nnever\n", codec, serve) == "did a\ndid bye\n");
    CHECK(codec.at("peek never") == codec.at("no such event"));
  }
}

TEST_CASE("with workers, answers without an id keep the order, and an answer with an id may overtake") {
  ToyCodec codec;
  cli::ServeOptions serve;
  serve.workers = 3;
  CHECK(serve_text("after:b a\nb\nc\n", codec, serve) == "did a\ndid b\ndid c\n");
  CHECK(codec.at("done b") < codec.at("done a"));  // b ran while a waited, and then waited its turn

  ToyCodec with_ids;
  CHECK(serve_text("id after:b a\nid b\n", with_ids, serve) == "did b\ndid a\n");
}

TEST_CASE("no line is read past the in-flight window until the oldest is answered") {
  ToyCodec codec;
  cli::ServeOptions serve;
  serve.workers = 3;
  serve.max_in_flight = 2;
  CHECK(serve_text("sleep:300 a\nb\nc\nd\n", codec, serve) == "did a\ndid b\ndid c\ndid d\n");
  // c takes the window's last place only when a is answered; d is read after that.
  CHECK(codec.at("done a") < codec.at("peek d"));
  CHECK(codec.at("done a") < codec.at("done c"));
}
