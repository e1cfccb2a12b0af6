// RpcChild: a child process spoken to in JSON-RPC on its stdin and stdout. Children
// here are small Python programs (python3 on PATH), each doing one thing a real skill or
// MCP server may do: answer out of order, ask the host, notify, write garbage, write too
// much, end, hang.
#include <machina/clock.hpp>
#include <machina/rpc_child.hpp>

#include <doctest/doctest.h>
#include <signal.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <future>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

using namespace machina;

namespace {

RpcChildOptions python(const std::string& program, std::size_t max_line = 1u << 20) {
  RpcChildOptions o;
  o.argv = {"/usr/bin/env", "python3", "-u", "-c", program};
  const char* path = std::getenv("PATH");
  o.env = {std::string("PATH=") + (path != nullptr ? path : "/usr/bin:/bin")};
  o.max_line_bytes = max_line;
  return o;
}

const RpcChild::RequestHandler kRefuse = [](const jsonrpc::Message& m, std::string& reply) {
  jsonrpc::append_error(reply, m.id, jsonrpc::kMethodNotFound, "Method not found");
};
const RpcChild::NotificationHandler kIgnore = [](const jsonrpc::Message&) {};

std::int64_t in_ms(std::int64_t ms) {
  return steady_now_ms() + ms;
}

/// Longer than any wait here may take on a loaded machine, shorter than the deadlines the
/// tests show are not waited for: a bound that catches a hang, not a slow machine.
constexpr std::int64_t kHangGuardMs = 10'000;

// Reads three requests, then answers them last first (each with its own params).
const char* kReversed = R"(
import json, sys
got = [json.loads(sys.stdin.readline()) for _ in range(3)]
for m in reversed(got):
    print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": m["params"]}), flush=True)
sys.stdin.read()
)";

}  // namespace

TEST_CASE("answers are matched to their calls by id, whatever their order") {
  RpcChild child(python(kReversed), kRefuse, kIgnore);
  std::vector<std::future<RpcChild::Reply>> calls;
  for (int i = 0; i < 3; ++i) {
    calls.push_back(std::async(std::launch::async, [&child, i] {
      return child.call("echo", "{\"n\":" + std::to_string(i) + "}", in_ms(10'000));
    }));
  }
  for (int i = 0; i < 3; ++i) {
    const auto r = calls[i].get();
    CHECK(r.ending == RpcChild::Reply::Ending::result);
    CHECK(r.result == "{\"n\": " + std::to_string(i) + "}");
  }
  CHECK(child.in_flight() == 0);
  child.finish(2000);
  CHECK_FALSE(child.alive());
}

TEST_CASE("the child's requests are answered and its notifications handed on") {
  const char* program = R"(
import json, sys
call = json.loads(sys.stdin.readline())
print(json.dumps({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}), flush=True)
print(json.dumps({"jsonrpc": "2.0", "id": "c1", "method": "state/get", "params": {}}), flush=True)
answer = json.loads(sys.stdin.readline())
print(json.dumps({"jsonrpc": "2.0", "id": call["id"], "result": {"host_said": answer}}), flush=True)
sys.stdin.read()
)";
  std::atomic<int> notified{0};
  RpcChild child(
      python(program),
      [](const jsonrpc::Message& m, std::string& reply) {
        CHECK(m.method == "state/get");
        jsonrpc::append_result(reply, m.id, "{\"slots\":{}}");
      },
      [&](const jsonrpc::Message& m) {
        CHECK(m.method == "notifications/progress");
        ++notified;
      });
  const auto r = child.call("go", "{}", in_ms(10'000));
  REQUIRE(r.ending == RpcChild::Reply::Ending::result);
  CHECK(r.result == R"({"host_said": {"jsonrpc": "2.0", "id": "c1", "result": {"slots": {}}}})");
  CHECK(notified == 1);
}

TEST_CASE("an error answer is an error, with its code, message and data") {
  const char* program = R"(
import json, sys
m = json.loads(sys.stdin.readline())
print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "error": {"code": -32000, "message": "nope", "data": [1]}}), flush=True)
sys.stdin.read()
)";
  RpcChild child(python(program), kRefuse, kIgnore);
  const auto r = child.call("x", "{}", in_ms(10'000));
  CHECK(r.ending == RpcChild::Reply::Ending::error);
  CHECK(r.code == -32000);
  CHECK(r.message == "nope");
  CHECK(r.data == "[1]");
}

TEST_CASE("garbage, a message over the cap or an end fail every call in flight") {
  SUBCASE("garbage") {
    RpcChild child(python("import sys\nsys.stdin.readline(); sys.stdin.readline()\nprint('hello there', flush=True)\n"
                          "sys.stdin.read()"),
                   kRefuse, kIgnore);
    auto other = std::async(std::launch::async, [&] { return child.call("a", "{}", in_ms(10'000)); });
    const auto r = child.call("b", "{}", in_ms(10'000));
    CHECK(r.ending == RpcChild::Reply::Ending::crashed);
    CHECK(r.message.find("not JSON-RPC") != std::string::npos);
    CHECK(r.message.find("hello there") != std::string::npos);
    CHECK(other.get().ending == RpcChild::Reply::Ending::crashed);
    CHECK_FALSE(child.alive());
    CHECK(child.call("c", "{}", in_ms(1000)).ending == RpcChild::Reply::Ending::crashed);
  }
  SUBCASE("a message over the cap") {
    RpcChild child(python("import sys\nsys.stdin.readline()\nsys.stdout.write('{' * 5000)\nsys.stdout.flush()\n"
                          "sys.stdin.read()",
                          1000),
                   kRefuse, kIgnore);
    const auto r = child.call("a", "{}", in_ms(10'000));
    CHECK(r.ending == RpcChild::Reply::Ending::crashed);
    CHECK(r.message.find("over 1000 bytes") != std::string::npos);
  }
  SUBCASE("an end, with the tail of its stderr") {
    RpcChild child(python("import sys\nsys.stdin.readline()\nsys.stderr.write('bye now\\n')\nsys.exit(4)"), kRefuse,
                   kIgnore);
    const auto r = child.call("a", "{}", in_ms(10'000));
    CHECK(r.ending == RpcChild::Reply::Ending::crashed);
    CHECK(r.message.find("exited with status 4") != std::string::npos);
    CHECK(r.message.find("bye now") != std::string::npos);
  }
}

TEST_CASE("a call ends at its deadline, or at once when cancelled") {
  RpcChild child(python("import sys\nsys.stdin.read()"), kRefuse, kIgnore);
  const auto t0 = steady_now_ms();
  const auto late = child.call("a", "{}", in_ms(200));
  CHECK(late.ending == RpcChild::Reply::Ending::timed_out);
  CHECK(steady_now_ms() - t0 >= 200);
  CHECK(steady_now_ms() - t0 < kHangGuardMs);

  CancelToken token;
  std::int64_t sent = 0;
  auto waiting = std::async(std::launch::async, [&] {
    return child.call("b", "{}", in_ms(60'000), &token, [&](std::int64_t id) { sent = id; });
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto t1 = steady_now_ms();
  token.cancel();
  const auto r = waiting.get();
  CHECK(r.ending == RpcChild::Reply::Ending::cancelled);
  CHECK(steady_now_ms() - t1 < kHangGuardMs);  // (its deadline is a minute away)
  CHECK(sent == 2);                            // ids count up from 1
  CHECK(child.alive());                        // (the child is not harmed: its owner decides what to tell it)
}

TEST_CASE("finish closes the child's input and kills one that does not leave") {
  RpcChild polite(python("import sys\nsys.stdin.read()"), kRefuse, kIgnore);
  const auto t0 = steady_now_ms();
  polite.finish(60'000);
  CHECK(steady_now_ms() - t0 < kHangGuardMs);  // it left on its own: no grace period waited out
  CHECK(polite.ended_how() == "it was closed");

  RpcChild stubborn(python("import signal, sys, time\nsys.stdin.read()\ntime.sleep(60)"), kRefuse, kIgnore);
  const auto t1 = steady_now_ms();
  stubborn.finish(300);
  CHECK(steady_now_ms() - t1 >= 300);
  CHECK(steady_now_ms() - t1 < kHangGuardMs);  // killed after the grace period, not at its own end
  CHECK_FALSE(stubborn.alive());
}

TEST_CASE("a lone caller reads its own answer: no other thread is woken for it") {
  // Calls made back to back read their answers themselves (the first may find the watch
  // thread reading, and take the turn from it).
  const char* program = R"(
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": {}}), flush=True)
)";
  RpcChild child(python(program), kRefuse, kIgnore);
  constexpr int kCalls = 20;
  for (int i = 0; i < kCalls; ++i) {
    REQUIRE(child.call("x", "{}", in_ms(10'000)).ending == RpcChild::Reply::Ending::result);
  }
  CHECK(child.answers_read_by_callers() >= kCalls / 2);
}

TEST_CASE("the child's requests and notifications are handled off the callers' threads") {
  // Before each answer the child notifies; the handler runs on the watch thread, never on
  // the caller's (a slow handler must not hold a caller past its deadline).
  const char* program = R"(
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    print(json.dumps({"jsonrpc": "2.0", "method": "notifications/message", "params": {}}), flush=True)
    print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": {}}), flush=True)
)";
  std::vector<std::thread::id> handlers;
  std::mutex mu;
  RpcChild child(python(program), kRefuse, [&](const jsonrpc::Message&) {
    std::lock_guard lock(mu);
    handlers.push_back(std::this_thread::get_id());
  });
  for (int i = 0; i < 5; ++i) {
    REQUIRE(child.call("x", "{}", in_ms(10'000)).ending == RpcChild::Reply::Ending::result);
  }
  std::lock_guard lock(mu);
  REQUIRE(handlers.size() == 5);
  CHECK(std::count(handlers.begin(), handlers.end(), std::this_thread::get_id()) == 0);
}

TEST_CASE("a slow answer to the child's request holds no caller past its deadline") {
  std::mutex mu;
  std::condition_variable released;
  bool release = false, answered = false;
  RpcChild child(
      python(R"(
import json, sys
m = json.loads(sys.stdin.readline())
print(json.dumps({"jsonrpc": "2.0", "id": "q", "method": "state/get", "params": {}}), flush=True)
sys.stdin.read()
)"),
      [&](const jsonrpc::Message& m, std::string& reply) {
        // Answers only once the caller has its reply (or the guard passed).
        std::unique_lock lock(mu);
        released.wait_for(lock, std::chrono::milliseconds(kHangGuardMs), [&] { return release; });
        answered = true;
        jsonrpc::append_result(reply, m.id, "{}");
      },
      kIgnore);
  CHECK(child.call("x", "{}", in_ms(300)).ending == RpcChild::Reply::Ending::timed_out);
  {
    std::lock_guard lock(mu);
    CHECK_FALSE(answered);  // the caller had its timeout while the request was still unanswered
    release = true;
  }
  released.notify_all();
}

TEST_CASE("a handler that throws: the child is told, and goes on") {
  const char* program = R"(
import json, sys
m = json.loads(sys.stdin.readline())
print(json.dumps({"jsonrpc": "2.0", "id": "q", "method": "boom", "params": {}}), flush=True)
answer = json.loads(sys.stdin.readline())
print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": {"host_said": answer}}), flush=True)
for line in sys.stdin:
    m = json.loads(line)
    print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": {"again": True}}), flush=True)
)";
  RpcChild child(
      python(program), [](const jsonrpc::Message&, std::string&) { throw std::runtime_error("handler failed"); },
      kIgnore);
  const auto r = child.call("x", "{}", in_ms(10'000));
  REQUIRE(r.ending == RpcChild::Reply::Ending::result);
  CHECK(r.result.find("-32603") != std::string::npos);
  CHECK(child.call("y", "{}", in_ms(10'000)).result == R"({"again": true})");
  CHECK(child.alive());
}

TEST_CASE("kill() ends a call whose caller is reading, even if the child's output never ends") {
  // A process of another session keeps the child's stdout open: no end of output comes.
  RpcChild child(python(R"(
import json, subprocess, sys
keeper = subprocess.Popen(["sleep", "30"], start_new_session=True)
m = json.loads(sys.stdin.readline())
print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": {"keeper": keeper.pid}}), flush=True)
sys.stdin.read()
)"),
                 kRefuse, kIgnore);
  const auto first = child.call("x", "{}", in_ms(10'000));
  REQUIRE(first.ending == RpcChild::Reply::Ending::result);
  const auto keeper = static_cast<pid_t>(nlohmann::json::parse(first.result)["keeper"].get<int>());
  auto waiting = std::async(std::launch::async, [&] { return child.call("never", "{}", in_ms(60'000)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto t0 = steady_now_ms();
  child.kill("stopped by the test");
  const auto r = waiting.get();
  ::kill(keeper, SIGKILL);
  CHECK(r.ending == RpcChild::Reply::Ending::crashed);
  CHECK(steady_now_ms() - t0 < kHangGuardMs);  // (its deadline is a minute away)
}

TEST_CASE("what the child writes between calls is read at once: its end is seen without a call") {
  RpcChild child(python(R"(
import json, sys, time
m = json.loads(sys.stdin.readline())
print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": {}}), flush=True)
time.sleep(0.2)
sys.stderr.write("leaving\n")
sys.exit(3)
)"),
                 kRefuse, kIgnore);
  REQUIRE(child.call("x", "{}", in_ms(10'000)).ending == RpcChild::Reply::Ending::result);
  const auto t0 = steady_now_ms();
  while (child.alive() && steady_now_ms() - t0 < kHangGuardMs)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK_FALSE(child.alive());
  CHECK(child.ended_how().find("exited with status 3") != std::string::npos);
  CHECK(child.ended_how().find("leaving") != std::string::npos);
}

TEST_CASE("a caller that gives up while reading hands the reading to one still waiting") {
  // "never" is never answered; "slow" is answered after 300 ms. The first caller reads
  // (it came first) and times out at 100 ms; the second must then read its own answer,
  // not wait until its own deadline.
  RpcChild child(python(R"(
import json, sys, threading, time
def answer(m):
    time.sleep(0.3)
    print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": {"slow": True}}), flush=True)
for line in sys.stdin:
    m = json.loads(line)
    if m["method"] == "slow":
        threading.Thread(target=answer, args=(m,)).start()
)"),
                 kRefuse, kIgnore);
  auto first = std::async(std::launch::async, [&] { return child.call("never", "{}", in_ms(100)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto t0 = steady_now_ms();
  const auto second = child.call("slow", "{}", in_ms(20'000));
  CHECK(first.get().ending == RpcChild::Reply::Ending::timed_out);
  CHECK(second.ending == RpcChild::Reply::Ending::result);
  CHECK(second.result == R"({"slow": true})");
  CHECK(steady_now_ms() - t0 < kHangGuardMs);  // (its deadline is 20 s away)
  // Read by the second caller itself (handed the turn when the first gave up), not by the
  // watch thread.
  CHECK(child.answers_read_by_callers() == 1);
}

TEST_CASE("a message that arrives in many pieces is read whole") {
  // 1 MiB of answer written in 64 pieces, each flushed on its own (many reads of the pipe),
  // then a second message in the same piece as the first one's end.
  RpcChild child(python(R"(
import json, sys, time
m = json.loads(sys.stdin.readline())
line = json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": {"text": "x" * (1 << 20)}}) + "\n"
step = len(line) // 64 + 1
for i in range(0, len(line), step):
    piece = line[i:i + step]
    if i + step >= len(line):
        piece += json.dumps({"jsonrpc": "2.0", "method": "notifications/message", "params": {}}) + "\n"
    sys.stdout.write(piece)
    sys.stdout.flush()
    time.sleep(0.002)
sys.stdin.read()
)",
                        4u << 20),
                 kRefuse, kIgnore);
  const auto r = child.call("x", "{}", in_ms(20'000));
  REQUIRE(r.ending == RpcChild::Reply::Ending::result);
  CHECK(r.result.size() == (1u << 20) + 12);  // {"text": "x…x"}
  CHECK(child.alive());
}
