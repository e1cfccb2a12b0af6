// Tools that misbehave on purpose, for the fault tests. Never shipped.
#include <machina/plugin.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

namespace {

using machina::plugin::Call;
using machina::plugin::Registry;
using machina::plugin::Result;

std::atomic<long> g_counter{0};

// Reads an unsigned integer field from a flat JSON object such as {"ms": 20}.
long field(std::string_view input, std::string_view name, long fallback) {
  const std::string key = "\"" + std::string(name) + "\"";
  const auto at = input.find(key);
  if (at == std::string_view::npos) return fallback;
  const auto colon = input.find(':', at);
  if (colon == std::string_view::npos) return fallback;
  return std::strtol(std::string(input.substr(colon + 1)).c_str(), nullptr, 10);
}

void fill(Registry& r) {
  r.tool("AID.TEST.CRASH.v1", [](Call&) -> Result {
     std::raise(SIGSEGV);
     return Result::fault;
   }).description("Dies of SIGSEGV.");
  r.tool("AID.TEST.ABORT.v1", [](Call&) -> Result {
     std::abort();
   }).description("Calls abort().");
  r.tool("AID.TEST.EXIT.v1", [](Call&) -> Result {
     std::_Exit(3);
   }).description("Exits the process with status 3.");
  r.tool("AID.TEST.THROW.v1", [](Call&) -> Result {
     throw std::runtime_error("deliberate failure");
   }).description("Throws; the C++ layer reports a fault.");
  r.tool("AID.TEST.HANG.v1", [](Call&) -> Result {
     for (;;) pause();
   }).description("Never returns.");
  r.tool("AID.TEST.PRINT.v1", [](Call& call) -> Result {
     std::printf("{\"ok\":true,\"status\":\"OK\",\"forged\":true}\n");
     std::fflush(stdout);
     const char raw[] = "raw bytes on fd 1\n";
     (void)!write(1, raw, sizeof raw - 1);
     call.output(R"({"printed":true})");
     return Result::ok;
   }).description("Writes to stdout (fd 1) and then answers normally.");
  r.tool("AID.TEST.HUGE.v1", [](Call& call) -> Result {
     const long n = field(call.input(), "bytes", 2 * 1024 * 1024);
     std::string out = "\"" + std::string(static_cast<std::size_t>(n), 'x') + "\"";
     if (!call.output(out)) return call.fail("output refused by the host");
     return Result::ok;
   }).description("Outputs a JSON string of `bytes` characters (default 2 MiB).");
  r.tool("AID.TEST.BADJSON.v1", [](Call& call) -> Result {
     call.output("{not json");
     return Result::ok;
   }).description("Reports success with output that is not JSON.");
  r.tool("AID.TEST.NOOUTPUT.v1", [](Call&) -> Result { return Result::ok; })
      .description("Reports success without setting an output.");
  r.tool("AID.TEST.FAIL.v1", [](Call& call) -> Result { return call.fail("the tool said no"); })
      .description("Returns a TOOL_ERROR.");
  r.tool("AID.TEST.BADUTF8.v1", [](Call& call) -> Result { return call.fail("bad \xff byte"); })
      .description("Returns an error message that is not UTF-8.");
  r.tool("AID.TEST.SLOW.v1", [](Call& call) -> Result {
     const long ms = field(call.input(), "ms", 50);
     std::this_thread::sleep_for(std::chrono::milliseconds(ms));
     const long n = ++g_counter;
     call.output("{\"slept_ms\":" + std::to_string(ms) + ",\"calls\":" + std::to_string(n) + "}");
     return Result::ok;
   }).description("Sleeps `ms` milliseconds, then reports how many calls this process ran.");
  r.tool("AID.TEST.COUNTER.v1", [](Call& call) -> Result {
     call.output("{\"calls\":" + std::to_string(++g_counter) + "}");
     return Result::ok;
   }).description("Counts its calls (not deterministic: shows whether a call really ran).");
  r.tool("AID.TEST.TIER2.v1", [](Call& call) -> Result {
     call.output(R"({"system":true})");
     return Result::ok;
   }).description("A tier-2 (system) tool.").tier(MACHINA_TIER_SYSTEM);
  r.tool("AID.TEST.SLOTFAIL.v1", [](Call& call) -> Result {
     call.set_slot(0, {"note", "\"written\"", "test", 9});
     return call.fail("failed after writing a slot");
   }).description("Writes DS0, then fails: a failed call must change no state.");
}

}  // namespace

MACHINA_PLUGIN(fill)
