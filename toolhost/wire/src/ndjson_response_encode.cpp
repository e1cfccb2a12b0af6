// NDJSON response encoding (encode_response in ndjson_wire.hpp): written straight into
// the output buffer, fields in a fixed order.
#include <machina/ds_state_codec.hpp>
#include <machina/json_text.hpp>
#include <machina/ndjson_wire.hpp>

#include <string>

namespace machina {

void encode_response(const Response& r, std::string& out) {
  out.push_back('{');
  if (!r.id_json.empty()) {
    append_literal(out, "\"id\":");
    out.append(r.id_json);
    out.push_back(',');
  }
  if (r.ok())
    append_literal(out, "\"ok\":true");
  else
    append_literal(out, "\"ok\":false");
  const ErrorKindInfo& info = error_info(r.kind);
  append_literal(out, ",\"status\":\"");
  out.append(status_name(info.status));
  out.push_back('"');
  if (info.call_response) {
    append_literal(out, ",\"output_json\":");
    append_json_string(out, r.output_json);
  }
  append_literal(out, ",\"error\":");
  append_json_string(out, r.error);
  if (!r.ok()) {
    append_literal(out, ",\"code\":\"");
    out.append(info.code);
    out.push_back('"');
  }
  if (r.kind == ErrorKind::lease_required) {
    append_literal(out, ",\"tier\":");
    out.append(std::to_string(r.lease_tier));
    append_literal(out, ",\"aid\":");
    append_json_string(out, r.lease_aid);
  } else if (r.kind == ErrorKind::lease_rejected) {
    append_literal(out, ",\"reason\":");
    append_json_string(out, r.lease_reason);
  }
  if (!r.hint.empty()) [[unlikely]] {
    append_literal(out, ",\"hint\":");
    append_json_string(out, r.hint);
  }
  if (info.call_response) {
    append_literal(out, ",\"ds_state\":");
    encode_ds_state(r.ds_state, out);
  }
  if (r.idempotent_hit) append_literal(out, ",\"idempotent_hit\":true");
  if (!r.trace_json.empty()) {
    append_literal(out, ",\"trace\":");
    out.append(r.trace_json);
  }
  append_literal(out, "}\n");
}

}  // namespace machina
