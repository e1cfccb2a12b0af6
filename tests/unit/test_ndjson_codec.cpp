// The NDJSON front: --serve's codec over the line server (one response line per request
// line, in order, an id echoed, a bad line refused without ending the stream, a line over the
// request cap answered from its head) and --run's one request on a descriptor (empty or
// oversized input refused), through pipes as the executable uses them.
#include "../../toolhost/cli/codecs/ndjson_codec.hpp"
#include "echo_tools.hpp"

#include <machina/child_process.hpp>
#include <machina/tool_host.hpp>

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

using namespace machina;
using nlohmann::json;

namespace {

/// A pipe's two ends, closed when it goes.
struct Pipe {
  int read_end = -1, write_end = -1;
  Pipe() { REQUIRE(::pipe(&read_end) == 0); }
  ~Pipe() {
    close_read();
    close_write();
  }
  void close_read() {
    if (read_end >= 0) ::close(read_end);
    read_end = -1;
  }
  void close_write() {
    if (write_end >= 0) ::close(write_end);
    write_end = -1;
  }
};

/// Writes `input` to one pipe on a thread of its own, runs `front` reading that pipe and
/// writing another, and returns what it wrote.
template <class Front>
std::string through_pipes(const std::string& input, Front&& front) {
  Pipe in, out;
  std::thread writer([&] {
    std::size_t at = 0;
    while (at < input.size()) {
      const ssize_t n = write_quietly(in.write_end, input.data() + at, input.size() - at);
      if (n <= 0) break;
      at += static_cast<std::size_t>(n);
    }
    in.close_write();
  });
  std::string written;
  std::thread reader([&] {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(out.read_end, buf, sizeof buf)) > 0) written.append(buf, static_cast<std::size_t>(n));
  });
  front(in.read_end, out.write_end);
  in.close_read();  // (a writer still blocked on a front that stopped reading gets EPIPE)
  out.close_write();
  writer.join();
  reader.join();
  return written;
}

std::vector<json> lines_of(const std::string& text) {
  std::vector<json> lines;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t end = text.find('\n', at);
    REQUIRE(end != std::string::npos);  // every line ends with a newline
    lines.push_back(json::parse(text.substr(at, end - at)));
    at = end + 1;
  }
  return lines;
}

}  // namespace

TEST_CASE("--serve answers each line in order, refusing a bad one without ending the stream") {
  HostOptions options;
  options.max_request_bytes = 4096;
  ToolHost tools(options);
  tools.add_linked_plugin(test::echo_tools());
  cli::NdjsonCodec codec;
  const std::string input = R"({"aid":"AID.UNIT.ECHO.v1","input_json":"{\"n\":1}","id":"a"})"
                            "\n"
                            "not json\n" +
                            std::string(R"({"aid":"AID.UNIT.ECHO.v1","input_json":")") + std::string(5000, 'x') +
                            "\"}\n"
                            R"({"aid":"AID.UNIT.ECHO.v1","inputs":{"n":2}})"
                            "\n";
  const std::string written = through_pipes(input, [&](int in_fd, int out_fd) {
    cli::ServeOptions serve;
    serve.in_fd = in_fd;
    serve.out_fd = out_fd;
    CHECK(cli::serve(tools.host(), codec, serve) == 0);
  });
  const std::vector<json> answers = lines_of(written);
  REQUIRE(answers.size() == 4);
  CHECK(answers[0].at("id") == "a");
  CHECK(answers[0].at("output_json") == R"({"n":1})");
  CHECK(answers[1].at("code") == "malformed_request");
  CHECK(answers[2].at("code") == "request_too_large");
  CHECK(answers[3].at("ok") == true);
  CHECK(json::parse(answers[3].at("output_json").get<std::string>()) == json{{"n", 2}});
}

TEST_CASE("--run answers its one request with the full state, and refuses empty or oversized input") {
  HostOptions options;
  options.max_request_bytes = 256;
  ToolHost tools(options);
  tools.add_linked_plugin(test::echo_tools());
  auto run = [&](const std::string& input) {
    return lines_of(through_pipes(input, [&](int in_fd, int out_fd) {
      CHECK(cli::run_once(tools.host(), "AID.UNIT.ECHO.v1", in_fd, out_fd) == 0);
    }));
  };
  const std::vector<json> ran = run(R"({"input_json":"{\"n\":3}"})");
  REQUIRE(ran.size() == 1);
  CHECK(ran[0].at("output_json") == R"({"n":3})");
  CHECK(ran[0].at("ds_state").contains("slots"));
  CHECK_FALSE(ran[0].at("ds_state").contains("delta"));  // the full state, not a delta
  const std::vector<json> empty = run(" \n");
  REQUIRE(empty.size() == 1);
  CHECK(empty[0].at("code") == "malformed_request");
  CHECK(empty[0].at("error").get<std::string>().find("no request on stdin") != std::string::npos);
  const std::vector<json> big = run(std::string(1000, ' '));
  REQUIRE(big.size() == 1);
  CHECK(big[0].at("code") == "request_too_large");
}
