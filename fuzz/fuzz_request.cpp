// Fuzz target: the request decoder. Never crashes; the fast path and the reference
// parser agree on every input (same verdict, same fields, same error); a decoded request
// re-encoded by the client encoder decodes to the same fields; the response to it is JSON.
#include <machina/json_text.hpp>
#include <machina/ndjson_client.hpp>
#include <machina/ndjson_wire.hpp>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

namespace {

std::string describe(bool ok, const machina::Request& r, const machina::Response& e) {
  std::string ds;
  if (r.ds_state) {
    auto changes = std::make_shared<machina::SlotChanges>(r.ds_state->changes);
    ds = r.ds_state->delta ? "delta:" : "full:";
    machina::encode_ds_state({machina::DsReport::Mode::delta, changes}, ds);
  }
  if (!ok) return "ERR|" + e.error + "|" + e.id_json;
  return "OK|" + r.aid + "|" + r.input_json + "|" + r.id_json + "|" + r.idempotency_key.value_or("<none>") + "|" +
         r.lease_token.value_or("<none>") + "|" + (r.timeout_ms ? std::to_string(*r.timeout_ms) : "-") + "|" + ds;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);  // NUL-terminated copy

  machina::Request fast, reference;
  machina::Response fast_err, reference_err;
  const bool fast_ok = machina::decode_request(text, fast, fast_err, /*nul_terminated=*/true);
  const bool reference_ok = machina::detail::decode_request_reference(text, reference, reference_err);
  if (describe(fast_ok, fast, fast_err) != describe(reference_ok, reference, reference_err)) std::abort();

  std::string why_fast, why_reference;
  if (machina::validate_json(text, &why_fast) != machina::detail::validate_json_reference(text, &why_reference))
    std::abort();

  std::string line;
  machina::Response r =
      fast_ok ? machina::Response::failure(machina::ErrorKind::tool_error, fast.input_json) : fast_err;
  r.id_json = fast_ok ? fast.id_json : fast_err.id_json;
  machina::encode_response(r, line);
  line.pop_back();
  if (!machina::validate_json(line)) std::abort();

  if (fast_ok && !fast.aid.empty()) {
    std::string ds;
    if (fast.ds_state) {
      auto changes = std::make_shared<machina::SlotChanges>(fast.ds_state->changes);
      machina::encode_ds_state(
          {fast.ds_state->delta ? machina::DsReport::Mode::delta : machina::DsReport::Mode::full, changes}, ds);
    }
    std::string encoded;
    machina::encode_request(fast, std::nullopt, ds, encoded);
    encoded.pop_back();
    machina::Request again;
    machina::Response err;
    if (!machina::decode_request(encoded, again, err)) std::abort();
    again.id_json = fast.id_json;
    if (describe(true, again, err) != describe(true, fast, fast_err)) std::abort();
  }
  return 0;
}
