// The stdio fronts' input (cli/line_reader.hpp): lines split wherever the reads end, a last
// line without its newline, a line over the cap reported by its head and skipped while the
// buffer stays bounded, the caller told before each read that may block; --run's bounded
// whole-input read; and the stop signal the long-running fronts watch (cli/stop_signal.hpp).
#include "../../toolhost/cli/line_reader.hpp"
#include "../../toolhost/cli/stop_signal.hpp"

#include <doctest/doctest.h>

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

using machina::cli::LineReader;

namespace {

/// A pipe whose write end a thread feeds `parts` through, one write each, then closes.
struct Feeder {
  int fds[2] = {-1, -1};
  std::thread writer;
  explicit Feeder(std::vector<std::string> parts) {
    REQUIRE(::pipe(fds) == 0);
    writer = std::thread([parts = std::move(parts), fd = fds[1]] {
      for (const auto& p : parts) {
        std::size_t done = 0;
        while (done < p.size()) {
          const ssize_t n = ::write(fd, p.data() + done, p.size() - done);
          if (n <= 0) break;
          done += static_cast<std::size_t>(n);
        }
      }
      ::close(fd);
    });
  }
  ~Feeder() {
    writer.join();
    ::close(fds[0]);
  }
  Feeder(const Feeder&) = delete;
  Feeder& operator=(const Feeder&) = delete;
};

struct Read {
  LineReader::Next next;
  std::string text;
  bool nul_after;  // the view is followed in memory by '\0'
};

std::vector<Read> read_all(LineReader& reader, int* blocks = nullptr) {
  std::vector<Read> out;
  for (;;) {
    std::string_view line;
    const auto next = reader.next(line, [blocks] {
      if (blocks != nullptr) ++*blocks;
    });
    if (next == LineReader::Next::eof) return out;
    out.push_back({next, std::string(line), next == LineReader::Next::line && line.data()[line.size()] == '\0'});
  }
}

}  // namespace

TEST_CASE("lines come whole wherever the reads split them, the last one without its newline") {
  Feeder feed({"{\"a\":1}\n{\"b\"", ":2}\n\n", "tail"});
  LineReader reader(feed.fds[0], 1024);
  int blocks = 0;
  const auto lines = read_all(reader, &blocks);
  REQUIRE(lines.size() == 4);
  CHECK(lines[0].text == "{\"a\":1}");
  CHECK(lines[1].text == "{\"b\":2}");
  CHECK(lines[2].text.empty());
  CHECK(lines[3].text == "tail");
  for (const auto& l : lines) {
    CHECK(l.next == LineReader::Next::line);
    CHECK(l.nul_after);
  }
  CHECK(blocks >= 1);  // told before the first read, which may block
}

TEST_CASE("a line over the cap comes as its head, is skipped, and the next line reads whole") {
  const std::size_t cap = 1000;
  const std::string huge(3 * 1024 * 1024, 'x');  // many reads long: skipped, never kept
  Feeder feed(
      {"{\"id\":7,", huge, "}\n", "{\"ok\":1}\n", std::string(cap, 'y') + "\n", std::string(cap + 1, 'z'), "\n"});
  LineReader reader(feed.fds[0], cap);
  const auto lines = read_all(reader);
  REQUIRE(lines.size() == 4);
  CHECK(lines[0].next == LineReader::Next::too_large);
  CHECK(lines[0].text.size() <= LineReader::kHeadBytes);
  CHECK(lines[0].text.rfind("{\"id\":7,", 0) == 0);  // the head, which may name the request's id
  CHECK(lines[1].next == LineReader::Next::line);
  CHECK(lines[1].text == "{\"ok\":1}");
  CHECK(lines[2].next == LineReader::Next::line);  // exactly the cap: taken
  CHECK(lines[2].text.size() == cap);
  CHECK(lines[3].next == LineReader::Next::too_large);  // one past it: refused
}

TEST_CASE("the whole input is read up to its bound, and refused one byte past it") {
  std::string out;
  {
    Feeder feed({std::string(100, 'a'), std::string(28, 'b')});
    CHECK(machina::cli::read_all_bounded(feed.fds[0], 128, out));
    CHECK(out == std::string(100, 'a') + std::string(28, 'b'));
  }
  {
    Feeder feed({std::string(129, 'a')});
    CHECK_FALSE(machina::cli::read_all_bounded(feed.fds[0], 128, out));
    // (the 129 bytes fit in the pipe's buffer: the feeder's write has ended, unread)
  }
  {
    Feeder feed({});
    CHECK(machina::cli::read_all_bounded(feed.fds[0], 128, out));
    CHECK(out.empty());
  }
}

TEST_CASE("SIGTERM and SIGINT make the stop descriptor readable, and it stays one descriptor") {
  const int fd = machina::cli::watch_stop_signals();
  REQUIRE(fd >= 0);
  CHECK(machina::cli::watch_stop_signals() == fd);
  pollfd p{fd, POLLIN, 0};
  CHECK(::poll(&p, 1, 0) == 0);  // nothing yet
  REQUIRE(::raise(SIGTERM) == 0);
  CHECK(::poll(&p, 1, 1000) == 1);
  std::uint64_t count = 0;
  REQUIRE(::read(fd, &count, sizeof count) == static_cast<ssize_t>(sizeof count));
  CHECK(count == 1);
  REQUIRE(::raise(SIGINT) == 0);
  CHECK(::poll(&p, 1, 1000) == 1);
  // The rest of this process stops on these signals again.
  ::signal(SIGTERM, SIG_DFL);
  ::signal(SIGINT, SIG_DFL);
}
