// The client side of the NDJSON wire (ndjson_client.hpp): what the Python pool and spawn
// transports use through _core, tested here on its own.
#include <machina/ndjson_client.hpp>

#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <map>
#include <vector>

namespace {

struct Open final : machina::OpenRequests {
  std::vector<std::int64_t> ids;  // sending order
  bool is_open(std::int64_t id) const override {
    for (auto i : ids)
      if (i == id) return true;
    return false;
  }
  void oldest_first(const std::function<bool(std::int64_t)>& visit) const override {
    for (auto i : ids)
      if (!visit(i)) return;
  }
};

}  // namespace

TEST_CASE("match_responses hands out each complete line and stops at a partial one") {
  Open open;
  open.ids = {1, 2, 3};
  std::map<std::int64_t, std::string> got;
  const std::string text =
      "{\"id\":2,\"ok\":true,\"output_json\":\"2\"}\n\n{\"id\":1,\"ok\":false,\"error\":\"e\"}\n{\"id\":3,";
  const auto next = machina::match_responses(text, 0, open, [&](std::int64_t id, const machina::ResponseFields& f) {
    got[id] = f.ok ? f.output_json : f.error;
  });
  CHECK(got == std::map<std::int64_t, std::string>{{1, "e"}, {2, "2"}});
  CHECK(text.substr(next) == "{\"id\":3,");
}

TEST_CASE("an answer without an id goes to the oldest request not yet answered") {
  Open open;
  open.ids = {4, 5};
  std::vector<std::int64_t> order;
  machina::match_responses("{\"id\":4,\"ok\":true}\n{\"ok\":false,\"error\":\"too large\"}\n", 0, open,
                           [&](std::int64_t id, const machina::ResponseFields&) { order.push_back(id); });
  CHECK(order == std::vector<std::int64_t>{4, 5});
}

TEST_CASE("a stream that cannot be trusted is refused") {
  Open open;
  open.ids = {1};
  const auto none = [](std::int64_t, const machina::ResponseFields&) {};
  CHECK_THROWS_AS(machina::match_responses("{\"id\":9,\"ok\":true}\n", 0, open, none), machina::StreamError);
  CHECK_THROWS_AS(machina::match_responses("{\"id\":1,\"ok\":true}\n{\"id\":1,\"ok\":true}\n", 0, open, none),
                  machina::StreamError);
  CHECK_THROWS_AS(machina::match_responses("not json\n", 0, open, none), machina::StreamError);
  open.ids.clear();
  CHECK_THROWS_AS(machina::match_responses("{\"ok\":true}\n", 0, open, none), machina::StreamError);
}

TEST_CASE("delta_between reports only what changed") {
  std::string out, why;
  const std::string a = R"({"slots":{"DS1":{"type":"t","content_json":"1"},"DS2":{"type":"t","content_json":"2"}}})";
  const std::string b = R"({"slots":{"DS1":{"type":"t","content_json":"1"},"DS3":{"type":"t","content_json":"3"}}})";
  REQUIRE(machina::delta_between(a, b, out, why));
  CHECK(out.find("\"DS3\"") != std::string::npos);
  CHECK(out.find("\"DS1\"") == std::string::npos);
  CHECK(out.find("\"removed_slots\":[\"DS2\"]") != std::string::npos);
  REQUIRE(machina::delta_between(a, a, out, why));
  CHECK(out.empty());
  CHECK_FALSE(machina::delta_between("[1]", a, out, why));
  CHECK_FALSE(why.empty());
}

TEST_CASE("round_trip writes the request, reads one whole line, and tells when the writing ended") {
  int to_host[2], from_host[2];
  REQUIRE(pipe2(to_host, O_NONBLOCK | O_CLOEXEC) == 0);
  REQUIRE(pipe2(from_host, O_NONBLOCK | O_CLOEXEC) == 0);
  const std::string answer = "{\"id\":1,\"ok\":true}\n";
  REQUIRE(::write(from_host[1], answer.data(), answer.size()) == static_cast<ssize_t>(answer.size()));
  int told = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  auto rt = machina::round_trip(to_host[1], from_host[0], "{\"id\":1}\n", until, std::chrono::microseconds(0),
                                [&] { ++told; });
  CHECK(rt.status == machina::RoundTrip::Status::done);
  CHECK(rt.written == 9);
  CHECK(rt.data == answer);
  CHECK(told == 1);
  // Nothing comes: out of time, and the writing was still reported once.
  told = 0;
  rt = machina::round_trip(to_host[1], from_host[0], "x\n",
                           std::chrono::steady_clock::now() + std::chrono::milliseconds(20),
                           std::chrono::microseconds(0), [&] { ++told; });
  CHECK(rt.status == machina::RoundTrip::Status::out_of_time);
  CHECK(told == 1);
  // The host's end closed: end of output.
  ::close(from_host[1]);
  rt = machina::round_trip(to_host[1], from_host[0], "y\n", until, std::chrono::microseconds(0), [] {});
  CHECK(rt.status == machina::RoundTrip::Status::end_of_output);
  for (int fd : {to_host[0], to_host[1], from_host[0]}) ::close(fd);
}
