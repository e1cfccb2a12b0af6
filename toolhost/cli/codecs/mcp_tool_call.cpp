// See mcp_tool_call.hpp.
#include "mcp_tool_call.hpp"

#include <machina/json_text.hpp>
#include <machina/ndjson_wire.hpp>

#include <nlohmann/json.hpp>

#include <charconv>
#include <set>

#ifndef MACHINA_VERSION
#define MACHINA_VERSION "dev"
#endif

namespace machina::cli {
namespace {

using jsonrpc::Member;

constexpr const char kServerInfoStamp[] =
    R"("io.modelcontextprotocol/serverInfo":{"name":"machina-toolhost","version":")" MACHINA_VERSION R"("})";

}  // namespace

std::string_view server_info_stamp() {
  return kServerInfoStamp;
}

std::string error_data(ErrorKind kind) {
  const ErrorKindInfo& info = error_info(kind);
  std::string d = "{\"status\":\"";
  d.append(status_name(info.status));
  d += "\",\"code\":\"";
  d.append(info.code);
  d += "\"}";
  return d;
}

bool is_request_error(ErrorKind kind) {
  return kind == ErrorKind::malformed_request || kind == ErrorKind::invalid_ds_state ||
         kind == ErrorKind::tool_not_found || kind == ErrorKind::request_too_large;
}

bool read_call_params(const jsonrpc::Message& message, Request& request, std::string& token, std::string& why,
                      ErrorKind& kind) {
  const std::string_view params = message.params;
  if (params.empty() || params.front() != '{') {
    why = "malformed request: params must be an object with the tool's name";
    return false;
  }
  bool named = false, has_arguments = false, has_meta = false;
  std::string_view arguments, meta;
  std::string bad;
  std::string ignored;
  auto twice = [&](bool& seen, std::string_view key) {
    if (seen) bad = "params." + std::string(key) + " is given twice";
    seen = true;
    return bad.empty();
  };
  const bool ok = jsonrpc::each_param(
      message,
      [&](const Member& m) {
        if (m.key == "name") {
          if (!twice(named, m.key)) return false;
          if (m.type != Member::Type::string) {
            bad = std::string("params.name must be a string, not ") + jsonrpc::type_name(m.type);
            return false;
          }
          request.aid = std::string(m.string);
        } else if (m.key == "arguments") {
          if (!twice(has_arguments, m.key)) return false;
          if (m.type == Member::Type::null) return true;
          if (m.type != Member::Type::object) {
            bad = std::string("params.arguments must be an object, not ") + jsonrpc::type_name(m.type);
            return false;
          }
          arguments = m.raw;
        } else if (m.key == "_meta") {
          if (!twice(has_meta, m.key)) return false;
          if (m.type == Member::Type::null) return true;
          if (m.type != Member::Type::object) {
            bad = std::string("params._meta must be an object, not ") + jsonrpc::type_name(m.type);
            return false;
          }
          meta = m.raw;
        }
        return true;
      },
      ignored);
  if (!ok || !named || !bad.empty()) {
    why = "malformed request: " + (bad.empty() ? std::string("params.name (the tool) is missing") : bad);
    return false;
  }
  if (!arguments.empty()) {
    request.input_json = std::string(arguments);
    request.input_json_valid = message.params_valid_json;
  }
  if (meta.empty()) return true;
  std::set<std::string, std::less<>> seen;
  bool meta_ok = jsonrpc::for_each_member(
      meta,
      [&](const Member& m) {
        auto expect = [&](Member::Type type, const char* what) {
          if (m.type == type) return true;
          bad = "_meta." + std::string(m.key) + " must be " + what + ", not " + jsonrpc::type_name(m.type);
          return false;
        };
        const std::string_view k = m.key;
        if (!seen.emplace(k).second) {
          bad = "_meta." + std::string(k) + " is given twice";
          return false;
        }
        if (k == "progressToken") {
          if (m.type != Member::Type::string && m.type != Member::Type::number) {
            bad = std::string("_meta.progressToken must be a string or a number, not ") + jsonrpc::type_name(m.type);
            return false;
          }
          token = std::string(m.raw);
          return true;
        }
        if (k.substr(0, 8) != "machina/" || m.type == Member::Type::null) return true;  // (others' keys; null: absent)
        const std::string_view field = k.substr(8);
        if (field == "idempotency_key") {
          if (!expect(Member::Type::string, "a string")) return false;
          request.idempotency_key = std::string(m.string);
        } else if (field == "lease_token") {
          if (!expect(Member::Type::string, "a string")) return false;
          request.lease_token = std::string(m.string);
        } else if (field == "trace_id") {
          if (!expect(Member::Type::string, "a string")) return false;
          request.trace_id = std::string(m.string);
        } else if (field == "user") {
          if (!expect(Member::Type::string, "a string")) return false;
          request.user = std::string(m.string);
        } else if (field == "input_json") {
          if (!expect(Member::Type::string, "a string holding JSON text")) return false;
          request.input_json = std::string(m.string);
          request.input_json_valid = false;  // (a decoded string: the parse checked only its escapes)
        } else if (field == "timeout_ms") {
          if (!expect(Member::Type::number, "an integer")) return false;
          std::int64_t v = 0;
          const auto [end, ec] = std::from_chars(m.raw.data(), m.raw.data() + m.raw.size(), v);
          if (ec != std::errc() || end != m.raw.data() + m.raw.size()) {
            bad = "_meta.machina/timeout_ms must be an integer, not " + std::string(m.raw);
            return false;
          }
          request.timeout_ms = v;
        } else if (field == "ds_state") {
          DsUpdate update;
          std::string ds_why;
          if (!decode_ds_state(m.raw, update, ds_why)) {
            bad = ds_why;
            kind = ErrorKind::invalid_ds_state;
            return false;
          }
          request.ds_state = std::move(update);
        }
        return true;
      },
      ignored);
  if (!meta_ok) {
    why = kind == ErrorKind::invalid_ds_state ? bad : "malformed request: " + bad;
    return false;
  }
  return true;
}

void append_call_result(const Response& r, std::string_view id, ResultForm form, std::string& out) {
  const ErrorKindInfo& info = error_info(r.kind);
  if (is_request_error(r.kind)) {
    const int code = r.kind == ErrorKind::request_too_large ? jsonrpc::kInvalidRequest : jsonrpc::kInvalidParams;
    return jsonrpc::append_error(out, id, code, r.error, error_data(r.kind));
  }
  append_literal(out, "{\"jsonrpc\":\"2.0\",\"id\":");
  out.append(id);
  append_literal(out, ",\"result\":{\"content\":");
  std::string_view text = r.ok() ? std::string_view(r.output_json) : std::string_view(r.error);
  // A tool that answers a string is read as that text, not as the JSON that quotes it.
  std::string decoded;
  if (r.ok() && !text.empty() && text.front() == '"') {
    const auto value = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (value.is_string()) {
      decoded = value.get<std::string>();
      text = decoded;
    }
  }
  if (form != ResultForm::skill) {
    append_literal(out, "[{\"type\":\"text\",\"text\":");
    append_json_string(out, text);
    append_literal(out, "}]");
  } else {
    append_json_string(out, text);  // a skill's: a string
  }
  // MCP's structured content is an object (2025 revisions); a skill's may be any JSON.
  if (r.ok() && (form == ResultForm::skill || starts_json_object(r.output_json))) {
    append_literal(out, ",\"structuredContent\":");
    out.append(r.output_json);
  }
  out.append(r.ok() ? std::string_view(",\"isError\":false") : std::string_view(",\"isError\":true"));
  const bool stamped = form == ResultForm::mcp_stamped;
  if (stamped) append_literal(out, ",\"resultType\":\"complete\"");
  // What MCP has no place for: the host's status and code, the ds_state delta, the trace.
  const bool has_state = info.call_response && r.ds_state.mode != DsReport::Mode::none && r.ds_state.changes;
  if (stamped || !r.ok() || has_state || r.idempotent_hit || !r.trace_json.empty()) {
    append_literal(out, ",\"_meta\":{");
    bool first = true;
    auto key = [&](const char* name) {
      if (!first) out.push_back(',');
      first = false;
      out.push_back('"');
      out.append(name);
      append_literal(out, "\":");
    };
    if (!r.ok()) {
      key("machina/status");
      append_json_string(out, status_name(info.status));
      key("machina/code");
      append_json_string(out, info.code);
      if (r.kind == ErrorKind::lease_required) {
        key("machina/tier");
        out.append(std::to_string(r.lease_tier));
        key("machina/aid");
        append_json_string(out, r.lease_aid);
      } else if (r.kind == ErrorKind::lease_rejected) {
        key("machina/reason");
        append_json_string(out, r.lease_reason);
      }
    }
    if (has_state) {
      key("machina/ds_state");
      encode_ds_state(r.ds_state, out);
    }
    if (r.idempotent_hit) {
      key("machina/idempotent_hit");
      append_literal(out, "true");
    }
    if (!r.trace_json.empty()) {
      key("machina/trace");
      out.append(r.trace_json);
    }
    if (stamped) {
      if (!first) out.push_back(',');
      out.append(server_info_stamp());
    }
    out.push_back('}');
  }
  append_literal(out, "}}\n");
}

}  // namespace machina::cli
