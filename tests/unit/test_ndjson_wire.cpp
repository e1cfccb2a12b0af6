// The NDJSON wire: request decoding (both parsers), ds_state forms, response encoding, and the
// error-kind table behind every response's status.
#include <machina/errors.hpp>
#include <machina/ndjson_wire.hpp>

#include <doctest/doctest.h>

#include "string_cases.hpp"

#include <string>

using namespace machina;

namespace {
std::string encoded(const Response& r) {
  std::string out;
  encode_response(r, out);
  return out;
}
}  // namespace

TEST_CASE("a request decodes into its fields, with the id kept as JSON text") {
  Request req;
  Response err;
  REQUIRE(decode_request(
      R"({"id":"\u0078","aid":"AID.ECHO.v1","input_json":"[1]","timeout_ms":50,"idempotency_key":"k"})", req, err));
  CHECK(req.aid == "AID.ECHO.v1");
  CHECK(req.input_json == "[1]");
  CHECK(req.id_json == R"("x")");  // re-encoded
  CHECK(req.timeout_ms == 50);
  CHECK(req.idempotency_key == "k");
  CHECK_FALSE(req.ds_state.has_value());
}

TEST_CASE("both parsers refuse the same bad requests with the same words") {
  for (const char* text : {R"({"aid":5})", R"({"input_json":"{}"})", R"([1])", R"({"aid":"A","aid":"B"})"}) {
    CAPTURE(text);
    Request fast, reference;
    Response fast_err, reference_err;
    CHECK_FALSE(decode_request(text, fast, fast_err));
    CHECK_FALSE(detail::decode_request_reference(text, reference, reference_err));
    CHECK(fast_err.kind == ErrorKind::malformed_request);
    CHECK(fast_err.error == reference_err.error);
  }
}

TEST_CASE("ds_state slots may be named DS0..DS7 or 0..7, one form per request") {
  DsUpdate u;
  std::string why;
  REQUIRE(
      decode_ds_state(R"({"delta":true,"slots":{"3":{"type":"t","content_json":"1"}},"removed_slots":[5]})", u, why));
  CHECK(u.numbered);
  CHECK(u.changes.set == (1u << 3));
  CHECK(u.changes.removed == (1u << 5));
  REQUIRE(decode_ds_state(R"({"slots":{"DS2":{"type":"t","content_json":"[]"}}})", u, why));
  CHECK_FALSE(u.numbered);
  CHECK(u.changes.slots[2]->size_bytes == 2);
  CHECK_FALSE(
      decode_ds_state(R"({"delta":true,"slots":{"DS1":{"type":"t","content_json":"1"}},"removed_slots":[2]})", u, why));
  CHECK(why.find("use one form") != std::string::npos);
  CHECK_FALSE(decode_ds_state(R"({"delta":true,"removed_slots":[8]})", u, why));
  CHECK_FALSE(decode_ds_state(R"({"removed_slots":["DS1"]})", u, why));
  CHECK(why.find("needs \"delta\": true") != std::string::npos);
}

TEST_CASE("a response's ds_state is written in the form its request used") {
  auto changes = std::make_shared<SlotChanges>();
  changes->slots[4] = Artifact{"t", "1", "p", 1};
  changes->set = 1u << 4;
  changes->removed = 1u << 6;
  std::string named, numbered;
  encode_ds_state({DsReport::Mode::delta, changes, false}, named);
  encode_ds_state({DsReport::Mode::delta, changes, true}, numbered);
  CHECK(
      named ==
      R"({"delta":true,"slots":{"DS4":{"type":"t","content_json":"1","provenance":"p","size_bytes":1}},"removed_slots":["DS6"]})");
  CHECK(
      numbered ==
      R"({"delta":true,"slots":{"4":{"type":"t","content_json":"1","provenance":"p","size_bytes":1}},"removed_slots":[6]})");
}

TEST_CASE("every failure carries a status, only a call's failures carry output_json and ds_state") {
  for (const auto& info : all_error_kinds()) {
    CAPTURE(info.code);
    const std::string line = encoded(Response::failure(info.kind, "why"));
    CHECK(line.find("\"ok\":false,\"status\":\"" + std::string(status_name(info.status)) + "\"") == 1);
    CHECK(status_name(info.status) != "OK");
    CHECK((line.find("\"output_json\"") != std::string::npos) == info.call_response);
    CHECK((line.find("\"ds_state\"") != std::string::npos) == info.call_response);
  }
  CHECK(error_info(ErrorKind::tool_not_found).status == Status::INVALID_PICK);
  CHECK(error_info(ErrorKind::breaker_open).status == Status::BREAKER_TRIP);
  CHECK(error_info(ErrorKind::timeout).counts_for_breaker);
  CHECK_FALSE(error_info(ErrorKind::tool_error).counts_for_breaker);
}

TEST_CASE("strings decode as the reference parser decodes them, whatever their length, content and place") {
  // The fast parser scans strings sixteen bytes at a time from wherever they start, and
  // skips the UTF-8 check of the ones it found plain: every length across two blocks,
  // with something else at every place, at several alignments, must come out the same.
  const auto values = test::strings_with_inserts({
      "",
      "\\\"",
      "\\\\",
      "\\n",
      "\\u00e9",
      "\\ud83d\\ude00",
      "\\udc00",
      "\xC3\xA9",
      "\xF0\x9F\x98\x80",
      "\x01",
      "\x1F",
      "\x7F",
      "\xFF",
      "\xC3",
      "\\u0000",
      "\\x",
  });
  int compared = 0;
  for (const std::string& value : values) {
    for (std::size_t indent = 0; indent < 16; indent += 5) {
      const std::string pad(indent, ' ');
      for (const std::string& text :
           {"{" + pad + "\"aid\":\"" + value + "\",\"idempotency_key\":\"" + value + "\"}",
            "{" + pad + "\"x" + value + "\":1,\"aid\":\"A\"}", "{" + pad + "\"aid\":\"" + value}) {
        CAPTURE(text);
        Request fast, reference;
        Response fast_err, reference_err;
        const bool fast_ok = decode_request(text, fast, fast_err);
        const bool reference_ok = detail::decode_request_reference(text, reference, reference_err);
        REQUIRE(fast_ok == reference_ok);
        CHECK(fast.aid == reference.aid);
        CHECK(fast.idempotency_key == reference.idempotency_key);
        CHECK(fast_err.error == reference_err.error);
        ++compared;
      }
    }
  }
  CHECK(compared > 10'000);
}
