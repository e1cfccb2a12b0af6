// See nats_message_forms.hpp.
#include "nats_message_forms.hpp"

#include "nats_subjects.hpp"

#include <nlohmann/json.hpp>

namespace machina::cli {
namespace {

using json = nlohmann::json;

/// The aid of the tool `aid` is another name of, else `aid`.
std::string canonical(const ToolRegistry& tools, const std::string& aid) {
  const Tool* tool = tools.find(aid);
  return tool == nullptr || tool->info.alias_of.empty() ? aid : tool->info.alias_of;
}

}  // namespace

bool read_message(const ToolRegistry& tools, std::string_view subject, std::string_view subject_aid,
                  std::string_view data, const HeaderLookup& header, MessageCall& call, std::string& refusal) {
  const bool blank = data.find_first_not_of(" \t\r\n") == std::string_view::npos;
  // A request refused before its form is known is answered in its subject's usual form.
  call.form = subject_aid.starts_with("tools.") ? Form::tool_input : Form::envelope;
  auto refuse = [&](const std::string& why) {
    refusal = json{{"ok", false},
                   {"status", "INVALID_PICK"},
                   {"error", "malformed request: " + why},
                   {"code", "malformed_request"}}
                  .dump();
    return false;
  };
  json body = json::object();
  if (!blank) {
    body = json::parse(data, nullptr, false);
    if (body.is_discarded()) return refuse("the body is not JSON");
  }
  json options = json::object();
  const char* value = nullptr;
  if ((value = header(kHdrUser)) != nullptr && *value) options["user"] = value;
  if ((value = header(kHdrLease)) != nullptr && *value) options["_lease_token"] = value;
  if ((value = header(kHdrTimeoutMs)) != nullptr && *value) {
    const auto t = json::parse(value, nullptr, false);
    if (!t.is_number_integer()) return refuse(std::string(kHdrTimeoutMs) + " is not an integer");
    options["timeout_ms"] = t;
  }
  if ((value = header(kHdrIdempotencyKey)) != nullptr && *value) options["idempotency_key"] = value;

  if (body.is_object() && body.contains("function") && body["function"].is_object()) {
    call.form = Form::openai;
    const json& fn = body["function"];
    const json id = body.contains("tool_call_id") ? body["tool_call_id"] : body.value("id", json(""));
    call.tool_call_id = id.is_string() ? id.get<std::string>() : id.is_null() ? std::string() : id.dump();
    if (fn.contains("name") && fn["name"].is_string()) call.function_name = fn["name"].get<std::string>();
    if (call.function_name.empty()) return refuse("function.name must be a non-empty string");
    const Tool* named = tools.resolve(call.function_name);
    std::string aid = named == nullptr ? std::string() : named->info.aid;
    if (aid.empty()) {
      aid = call.function_name;  // the host answers tool_not_found
    } else if (!subject_aid.empty() && canonical(tools, aid) != canonical(tools, std::string(subject_aid))) {
      return refuse("function '" + call.function_name + "' is not the tool of subject '" + std::string(subject) + "'");
    }
    json arguments = fn.value("arguments", json("{}"));
    if (arguments.is_object()) arguments = arguments.dump();
    if (!arguments.is_string()) return refuse("function.arguments must be a JSON string");
    if (arguments.get_ref<const std::string&>().empty()) arguments = "{}";
    options["aid"] = aid;
    options["input_json"] = std::move(arguments);
    call.request = options.dump();
    return true;
  }
  if (subject_aid.empty() || (body.is_object() && (body.contains("aid") || body.contains("input_json")))) {
    call.form = Form::envelope;
    if (!body.is_object()) return refuse("a request must be a JSON object");
    call.request = blank ? std::string("{}") : std::string(data);
    call.run_aid = subject_aid;
    return true;
  }
  call.form = Form::tool_input;
  options["aid"] = subject_aid;
  options["input_json"] = blank ? std::string("{}") : std::string(data);
  call.request = options.dump();
  return true;
}

FormAnswer answer_in_form(const MessageCall& call, std::string_view line) {
  FormAnswer a;
  const json r = json::parse(line, nullptr, false);
  a.ok = r.is_object() && r.value("ok", false);
  std::string code;
  if (!a.ok) {
    auto text = [&](const char* field) {
      return r.is_object() && r.contains(field) && r[field].is_string() ? r[field].get<std::string>() : std::string();
    };
    a.error = text("error");
    if (a.error.empty()) a.error = "failed";
    code = text("code");
    a.headers = {{kHdrError, header_text(a.error, 1024)},
                 {kHdrErrorCode, service_error_code(text("status"), code)},
                 {kHdrWireCode, code}};
  }
  const std::string output = a.ok && r.contains("output_json") && r["output_json"].is_string() &&
                                     !r["output_json"].get_ref<const std::string&>().empty()
                                 ? r["output_json"].get<std::string>()
                                 : std::string("null");
  switch (call.form) {
    case Form::envelope: a.body = line; break;
    case Form::tool_input:
      a.body = a.ok ? "{\"data\":" + output + ",\"error\":null}"
                    : json{{"data", nullptr}, {"error", typed_error(a.error, code)}}.dump();
      break;
    case Form::openai: {
      std::string content = "Error: " + a.error;
      if (a.ok) {
        const json value = json::parse(output, nullptr, false);
        content = value.is_string() ? value.get<std::string>() : output;
      }
      a.body =
          json{
              {"tool_call_id", call.tool_call_id}, {"role", "tool"}, {"name", call.function_name}, {"content", content}}
              .dump();
      break;
    }
  }
  return a;
}

}  // namespace machina::cli
