// worker_protocol (the frames between the host and its isolated workers): every frame
// type round trips; every truncation, trailing byte, length past the payload and
// contradictory slot mask is refused.
#include <machina/isolation/worker_protocol.hpp>

#include <doctest/doctest.h>

#include <cstring>
#include <memory>
#include <string>

using namespace machina;
using namespace machina::worker;

namespace {

/// The payload of the one frame in `frame`, after checking its header.
std::string_view payload_of(const std::string& frame, FrameType expected) {
  REQUIRE(frame.size() >= kFrameHeader);
  std::uint32_t size = 0;
  FrameType type{};
  read_header(frame, size, type);
  CHECK(type == expected);
  CHECK(size == frame.size() - kFrameHeader);
  return std::string_view(frame).substr(kFrameHeader);
}

/// Whether `decode` refuses every proper prefix of `payload` and the payload with a byte more.
template <class Decode>
void check_refuses_truncations(std::string_view payload, Decode decode) {
  for (std::size_t n = 0; n < payload.size(); ++n) {
    CAPTURE(n);
    CHECK_FALSE(decode(payload.substr(0, n)));
  }
  CHECK_FALSE(decode(std::string(payload) + "x"));
  CHECK(decode(payload));
}

ToolInfo tool(const std::string& aid) {
  ToolInfo t;
  t.aid = aid;
  t.name = "name of " + aid;
  t.description = "does things";
  t.input_schema = R"({"type":"object"})";
  t.plugin_path = "/opt/p.so";
  t.tags = {"a", "b"};
  t.side_effects = {"fs"};
  t.deterministic = true;
  t.replay_inputs = true;
  t.tier = -3;
  t.default_timeout_ms = 2500;
  return t;
}

}  // namespace

TEST_CASE("hello round trips every tool field the frame carries") {
  Hello hello;
  hello.tools = {tool("AID.A.v1"), tool("AID.B.v1")};
  hello.tools[1].deterministic = false;
  hello.tools[1].tags.clear();
  std::string frame;
  encode_hello(hello, frame);
  const std::string_view payload = payload_of(frame, FrameType::hello);
  Hello back;
  REQUIRE(decode_hello(payload, back));
  CHECK(back.tools == hello.tools);
  check_refuses_truncations(payload, [](std::string_view p) {
    Hello h;
    return decode_hello(p, h);
  });
}

TEST_CASE("a hello claiming more strings than bytes is refused without allocating them") {
  std::string payload;
  const std::uint32_t tools = 1;
  payload.append(reinterpret_cast<const char*>(&tools), 4);
  for (int i = 0; i < 5; ++i) payload.append(8, '\0');  // five empty strings
  const std::uint32_t tags = 0xFFFFFFFFu;
  payload.append(reinterpret_cast<const char*>(&tags), 4);
  Hello h;
  CHECK_FALSE(decode_hello(payload, h));
}

TEST_CASE("ready, ended and died round trip") {
  std::string frame;
  encode_ready(Ready{42}, frame);
  Ready ready;
  REQUIRE(decode_ready(payload_of(frame, FrameType::ready), ready));
  CHECK(ready.pid == 42);
  check_refuses_truncations(payload_of(frame, FrameType::ready), [](std::string_view p) {
    Ready r;
    return decode_ready(p, r);
  });

  frame.clear();
  encode_ended(Ended{7, 2, 9}, frame);
  Ended ended;
  REQUIRE(decode_ended(payload_of(frame, FrameType::ended), ended));
  CHECK(ended.pid == 7);
  CHECK(ended.code == 2);
  CHECK(ended.status == 9);
  check_refuses_truncations(payload_of(frame, FrameType::ended), [](std::string_view p) {
    Ended e;
    return decode_ended(p, e);
  });

  char died[kDiedFrameBytes];
  encode_died(11, died);
  const std::string died_frame(died, kDiedFrameBytes);
  std::int32_t signal = 0;
  REQUIRE(decode_died(payload_of(died_frame, FrameType::died), signal));
  CHECK(signal == 11);
  check_refuses_truncations(payload_of(died_frame, FrameType::died), [](std::string_view p) {
    std::int32_t s = 0;
    return decode_died(p, s);
  });
}

TEST_CASE("a call carries its aid, input and only the slots that are set") {
  Slots state;
  state[1] = Artifact{"text", "\"one\"", "p1", 3};
  state[6] = Artifact{"json", "{}", "", 0};
  std::string frame;
  encode_call("AID.X.v1", R"({"k":1})", &state, frame);
  const std::string_view payload = payload_of(frame, FrameType::call);
  Call call;
  REQUIRE(decode_call(payload, call));
  CHECK(call.aid == "AID.X.v1");
  CHECK(call.input_json == R"({"k":1})");
  REQUIRE(call.state);
  CHECK(*call.state == state);
  check_refuses_truncations(payload, [](std::string_view p) {
    Call c;
    return decode_call(p, c);
  });

  frame.clear();
  encode_call("AID.Y.v1", "null", nullptr, frame);
  Call empty;
  REQUIRE(decode_call(payload_of(frame, FrameType::call), empty));
  CHECK(empty.aid == "AID.Y.v1");
  CHECK_FALSE(empty.state);
}

TEST_CASE("a string length past the payload is refused") {
  std::string frame;
  encode_call("AID.X.v1", "1", nullptr, frame);
  std::string payload(payload_of(frame, FrameType::call));
  const std::uint64_t huge = 1ull << 40;
  std::memcpy(payload.data(), &huge, sizeof huge);
  Call call;
  CHECK_FALSE(decode_call(payload, call));
}

TEST_CASE("a result round trips rc, flags, output, error and slot changes") {
  CallContext ctx(1024, std::make_shared<const Slots>());
  REQUIRE(ctx.set_output(std::string(R"({"ok":true})")));
  ctx.output_overflow = true;
  ctx.error = "partial";
  ctx.writes().slots[3] = Artifact{"t", "[1,2]", "tool", 2};
  ctx.writes().set = 0b1000;
  ctx.writes().removed = 0b0001;
  std::string frame;
  encode_result(-2, ctx, frame);
  const std::string_view payload = payload_of(frame, FrameType::result);
  Result r;
  REQUIRE(decode_result(payload, r));
  CHECK(r.rc == -2);
  CHECK(r.output_set);
  CHECK(r.output_overflow);
  CHECK(r.output == R"({"ok":true})");
  CHECK(r.error == "partial");
  CHECK(r.changes.set == 0b1000);
  CHECK(r.changes.removed == 0b0001);
  REQUIRE(r.changes.slots[3]);
  CHECK(r.changes.slots[3]->content_json == "[1,2]");
  CHECK(r.changes.slots[3]->size_bytes == 2);
  check_refuses_truncations(payload, [](std::string_view p) {
    Result x;
    return decode_result(p, x);
  });
}

TEST_CASE("a result that both sets and removes one slot is refused") {
  CallContext ctx(1024, std::make_shared<const Slots>());
  ctx.writes().slots[2] = Artifact{"t", "1", "p", 1};
  ctx.writes().set = 0b0100;
  std::string frame;
  encode_result(0, ctx, frame);
  std::string payload(payload_of(frame, FrameType::result));
  Result r;
  REQUIRE(decode_result(payload, r));
  // rc (4), flags (1), output and error (8 + 0 each), then the set mask and the removed mask.
  const std::size_t removed_at = 4 + 1 + 8 + 8 + 1;
  REQUIRE(payload[removed_at - 1] == 0b0100);
  payload[removed_at] = 0b0100;
  CHECK_FALSE(decode_result(payload, r));
}

TEST_CASE("several frames append to one buffer, each with its own header") {
  std::string buf;
  encode_ready(Ready{1}, buf);
  encode_ended(Ended{1, 1, 0}, buf);
  std::uint32_t size = 0;
  FrameType type{};
  read_header(buf, size, type);
  CHECK(type == FrameType::ready);
  CHECK(size == 4);
  read_header(std::string_view(buf).substr(kFrameHeader + size), size, type);
  CHECK(type == FrameType::ended);
  CHECK(size == 12);
}
