// The JSON Schema subset; see schema_validator.hpp.
#include <machina/errors.hpp>
#include <machina/json_text.hpp>
#include <machina/rapid_sax.hpp>  // first: RapidJSON configured as everywhere else
#include <machina/schema_validator.hpp>

#include <rapidjson/document.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <string_view>
#include <vector>

namespace machina {
namespace {

using json = nlohmann::json;

constexpr std::array<std::string_view, 16> kValidationKeywords = {
    "type",     "properties", "required",         "additionalProperties", "items",     "enum",      "const",
    "minimum",  "maximum",    "exclusiveMinimum", "exclusiveMaximum",     "minLength", "maxLength", "minItems",
    "maxItems", "uniqueItems"};
constexpr std::array<std::string_view, 8> kAnnotations = {"$schema",     "$id",     "$comment", "title",
                                                          "description", "default", "examples", "deprecated"};

// A location below `where` ("/" is the root).
std::string child(const std::string& where, const std::string& name) {
  return (where == "/" ? where : where + "/") + name;
}

using RValue = rapidjson::Value;

// The members of an object in key order, the order nlohmann iterates in: the first
// problem reported is the same whichever library reads the schema.
std::vector<const RValue::Member*> sorted_members(const RValue& object) {
  std::vector<const RValue::Member*> out;
  for (auto it = object.MemberBegin(); it != object.MemberEnd(); ++it) out.push_back(&*it);
  std::sort(out.begin(), out.end(), [](const RValue::Member* a, const RValue::Member* b) {
    return std::string_view(a->name.GetString(), a->name.GetStringLength()) <
           std::string_view(b->name.GetString(), b->name.GetStringLength());
  });
  return out;
}

std::string str(const RValue& v) {
  return std::string(v.GetString(), v.GetStringLength());
}

void check_schema(const RValue& s, const std::string& where) {
  if (s.IsBool()) return;
  if (!s.IsObject()) throw ConfigError("schema at " + where + " must be an object or a boolean");
  for (const RValue::Member* m : sorted_members(s)) {
    const std::string k = str(m->name);
    const RValue& v = m->value;
    const bool known =
        std::find(kValidationKeywords.begin(), kValidationKeywords.end(), k) != kValidationKeywords.end() ||
        std::find(kAnnotations.begin(), kAnnotations.end(), k) != kAnnotations.end();
    if (!known) throw ConfigError("schema keyword '" + k + "' at " + where + " is not supported");
    if (k == "properties") {
      if (!v.IsObject()) throw ConfigError("'properties' at " + where + " must be an object");
      for (const RValue::Member* p : sorted_members(v))
        check_schema(p->value, child(where, "properties/" + str(p->name)));
    } else if (k == "items" || k == "additionalProperties") {
      check_schema(v, child(where, k));
    } else if (k == "required") {
      if (!v.IsArray() || !std::all_of(v.Begin(), v.End(), [](const RValue& x) { return x.IsString(); }))
        throw ConfigError("'required' at " + where + " must be an array of strings");
    } else if (k == "enum") {
      if (!v.IsArray()) throw ConfigError("'enum' at " + where + " must be an array");
    } else if (k == "type") {
      auto ok = [](const RValue& t) {
        static constexpr std::array<std::string_view, 7> names = {"object", "array",   "string", "integer",
                                                                  "number", "boolean", "null"};
        return t.IsString() && std::find(names.begin(), names.end(),
                                         std::string_view(t.GetString(), t.GetStringLength())) != names.end();
      };
      if (!(ok(v) || (v.IsArray() && std::all_of(v.Begin(), v.End(), ok))))
        throw ConfigError("'type' at " + where + " must name JSON types");
    } else if (k.starts_with("min") || k.starts_with("max") || k.starts_with("exclusive")) {
      if (!v.IsNumber()) throw ConfigError("'" + k + "' at " + where + " must be a number");
    } else if (k == "uniqueItems") {
      if (!v.IsBool()) throw ConfigError("'uniqueItems' at " + where + " must be a boolean");
    }
  }
}

bool has_type(const json& v, std::string_view t) {
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  if (t == "integer") {
    if (v.is_number_integer()) return true;
    if (v.is_number_float()) {
      const double d = v.get<double>();
      return std::isfinite(d) && std::trunc(d) == d;
    }
    return false;
  }
  if (t == "number") return v.is_number();
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  return false;
}

std::size_t utf8_length(const std::string& s) {
  return static_cast<std::size_t>(
      std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

std::string escape_pointer(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

std::optional<std::string> check(const json& s, const json& v, const std::string& at);

std::optional<std::string> fail(const std::string& at, const std::string& why) {
  return "at " + (at.empty() ? std::string("/") : at) + ": " + why;
}

std::optional<std::string> check(const json& s, const json& v, const std::string& at) {
  if (s.is_boolean()) {
    if (s.get<bool>()) return std::nullopt;
    return fail(at, "no value is allowed here");
  }
  if (auto t = s.find("type"); t != s.end()) {
    bool ok = false;
    std::string names;
    if (t->is_string()) {
      ok = has_type(v, t->get_ref<const std::string&>());
      names = t->get<std::string>();
    } else {
      for (const auto& one : *t) {
        ok = ok || has_type(v, one.get_ref<const std::string&>());
        names += (names.empty() ? "" : " or ") + one.get<std::string>();
      }
    }
    if (!ok) return fail(at, "expected " + names + ", got " + v.type_name());
  }
  if (auto e = s.find("enum"); e != s.end()) {
    if (std::find(e->begin(), e->end(), v) == e->end()) return fail(at, "value is not one of the allowed values");
  }
  if (auto c = s.find("const"); c != s.end() && *c != v) return fail(at, "value must equal the schema's const");
  if (v.is_number()) {
    const double d = v.get<double>();
    if (auto m = s.find("minimum"); m != s.end() && d < m->get<double>()) return fail(at, "must be >= " + m->dump());
    if (auto m = s.find("maximum"); m != s.end() && d > m->get<double>()) return fail(at, "must be <= " + m->dump());
    if (auto m = s.find("exclusiveMinimum"); m != s.end() && d <= m->get<double>())
      return fail(at, "must be > " + m->dump());
    if (auto m = s.find("exclusiveMaximum"); m != s.end() && d >= m->get<double>())
      return fail(at, "must be < " + m->dump());
  }
  if (v.is_string()) {
    const std::size_t n = utf8_length(v.get_ref<const std::string&>());
    if (auto m = s.find("minLength"); m != s.end() && n < m->get<double>())
      return fail(at, "string shorter than " + m->dump() + " characters");
    if (auto m = s.find("maxLength"); m != s.end() && n > m->get<double>())
      return fail(at, "string longer than " + m->dump() + " characters");
  }
  if (v.is_array()) {
    if (auto m = s.find("minItems"); m != s.end() && v.size() < m->get<double>())
      return fail(at, "fewer than " + m->dump() + " items");
    if (auto m = s.find("maxItems"); m != s.end() && v.size() > m->get<double>())
      return fail(at, "more than " + m->dump() + " items");
    if (auto u = s.find("uniqueItems"); u != s.end() && u->get<bool>()) {
      for (std::size_t i = 0; i < v.size(); ++i)
        for (std::size_t j = i + 1; j < v.size(); ++j)
          if (v[i] == v[j]) return fail(at, "items are not unique");
    }
    if (auto items = s.find("items"); items != s.end()) {
      for (std::size_t i = 0; i < v.size(); ++i)
        if (auto err = check(*items, v[i], at + "/" + std::to_string(i))) return err;
    }
  }
  if (v.is_object()) {
    if (auto req = s.find("required"); req != s.end()) {
      for (const auto& name : *req)
        if (!v.contains(name.get_ref<const std::string&>()))
          return fail(at, "missing required property '" + name.get<std::string>() + "'");
    }
    const auto props = s.find("properties");
    const auto extra = s.find("additionalProperties");
    for (const auto& [k, sub] : v.items()) {
      const std::string child = at + "/" + escape_pointer(k);
      if (props != s.end() && props->contains(k)) {
        if (auto err = check((*props)[k], sub, child)) return err;
      } else if (extra != s.end()) {
        if (extra->is_boolean() && !extra->get<bool>()) return fail(at, "property '" + k + "' is not allowed");
        if (auto err = check(*extra, sub, child)) return err;
      }
    }
  }
  return std::nullopt;
}

}  // namespace

SchemaValidator::SchemaValidator(std::string schema_text) : text_(std::move(schema_text)) {
  // validate_json decides exactly as the nlohmann parse in compiled() will (the fast
  // path only ever accepts what nlohmann accepts), so compiling cannot fail later.
  if (!validate_json(text_)) throw ConfigError("input schema is not valid JSON");
  rapidjson::Document doc;
  doc.Parse<rapidjson::kParseFullPrecisionFlag>(text_.data(), text_.size());
  if (doc.HasParseError()) throw ConfigError("input schema is not valid JSON");
  check_schema(doc, "/");
}

const json& SchemaValidator::compiled() const {
  std::call_once(once_, [&] { schema_ = json::parse(text_); });
  return schema_;
}

std::optional<std::string> SchemaValidator::validate(const json& instance) const {
  return check(compiled(), instance, "");
}

}  // namespace machina
