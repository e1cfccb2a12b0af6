// PythonWorkerPool with real worker interpreters (python3 on PATH, the tool worker's own
// source): a call is answered by a warm worker, a worker that dies is replaced and its
// call answered `crashed`, a call past its deadline is answered `timed_out` with its worker
// killed, and a closed pool answers `closed`.
#include <machina/clock.hpp>
#include <machina/runners/python_interpreter.hpp>
#include <machina/runners/python_worker_pool.hpp>
#include <machina/tool_protocol.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "temp_dir.hpp"

#include <cstdlib>
#include <fstream>
#include <string>

using namespace machina;

namespace {

const char* kTools = R"(
import os, time
def double(x):
    return {"twice": x["n"] * 2, "pid": os.getpid()}
def die(x):
    os._exit(3)
def nap(x):
    time.sleep(x["s"])
    return {}
)";

struct Pool {
  TempDir dir;
  std::unique_ptr<PythonWorkerPool> pool;
  Pool() {
    std::ofstream(dir.path / "unit_tools.py") << kTools;
    PythonPoolOptions o;
    o.python = resolve_interpreter("python3", ".");
    o.roots = {dir.path.string()};
    const char* path = std::getenv("PATH");
    o.env = {std::string("PATH=") + (path != nullptr ? path : "/usr/bin:/bin"), "PYTHONDONTWRITEBYTECODE=1"};
    o.workers = 1;
    o.max_answer_bytes = 1 << 20;
    pool = std::make_unique<PythonWorkerPool>(std::move(o));
  }
};

std::string line_for(const char* entry, const std::string& input, std::int64_t deadline_ms) {
  std::string line;
  tool_protocol::encode_local_call({"unit", entry, input, false, "trace-1", {}, deadline_ms}, line);
  line.push_back('\n');
  return line;
}

PythonWorkerPool::Exchange call(PythonWorkerPool& pool, const char* entry, const std::string& input,
                                std::int64_t timeout_ms = 10'000) {
  const std::int64_t deadline = steady_now_ms() + timeout_ms;
  return pool.call(line_for(entry, input, deadline), deadline);
}

nlohmann::json result_of(const PythonWorkerPool::Exchange& ex) {
  tool_protocol::Answer answer;
  std::string why;
  REQUIRE(tool_protocol::decode_answer(ex.answer, answer, why));
  REQUIRE(answer.ok);
  return nlohmann::json::parse(answer.result);
}

}  // namespace

TEST_CASE("a warm worker answers call after call") {
  Pool p;
  const auto first = call(*p.pool, "unit_tools:double", R"({"n":21})");
  REQUIRE(first.ending == PythonWorkerPool::Exchange::Ending::answered);
  const auto r1 = result_of(first);
  CHECK(r1["twice"] == 42);
  const auto second = call(*p.pool, "unit_tools:double", R"({"n":2})");
  REQUIRE(second.ending == PythonWorkerPool::Exchange::Ending::answered);
  const auto r2 = result_of(second);
  CHECK(r2["twice"] == 4);
  CHECK(r2["pid"] == r1["pid"]);  // the same worker, still warm
  CHECK(p.pool->stats().started == 1);
}

TEST_CASE("a worker that dies is replaced, its call is answered crashed") {
  Pool p;
  const auto died = call(*p.pool, "unit_tools:die", "{}");
  CHECK(died.ending == PythonWorkerPool::Exchange::Ending::crashed);
  CHECK(died.detail.find("its Python worker") != std::string::npos);
  const auto next = call(*p.pool, "unit_tools:double", R"({"n":1})");
  REQUIRE(next.ending == PythonWorkerPool::Exchange::Ending::answered);
  CHECK(result_of(next)["twice"] == 2);
  CHECK(p.pool->stats().replaced >= 1);
  CHECK(p.pool->stats().started == 2);
}

TEST_CASE("a call past its deadline is timed out and its worker killed, a closed pool answers closed") {
  Pool p;
  const auto slow = call(*p.pool, "unit_tools:nap", R"({"s":30})", 300);
  CHECK(slow.ending == PythonWorkerPool::Exchange::Ending::timed_out);
  CHECK(slow.killed);
  const auto next = call(*p.pool, "unit_tools:double", R"({"n":5})");
  REQUIRE(next.ending == PythonWorkerPool::Exchange::Ending::answered);
  CHECK(result_of(next)["twice"] == 10);
  p.pool->close();
  CHECK(call(*p.pool, "unit_tools:double", R"({"n":5})").ending == PythonWorkerPool::Exchange::Ending::closed);
}
