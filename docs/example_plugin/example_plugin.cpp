// Example machina-toolhost plugin: converts values between units of length, mass and
// temperature. Uses only the plugin headers (machina/plugin.hpp) and the standard library.
#include <machina/plugin.hpp>

#include <array>
#include <charconv>
#include <cmath>
#include <string>
#include <string_view>

namespace {

using machina::plugin::Call;
using machina::plugin::Registry;
using machina::plugin::Result;

// A unit converts to the base unit of its dimension (metre, kilogram, kelvin) as
// base = value * scale + offset. Only temperatures need an offset.
struct Unit {
  std::string_view name;
  std::string_view dimension;
  double scale;
  double offset;
};

// Grouped by dimension: list_units relies on that order.
constexpr std::array<Unit, 15> kUnits{{
    {"mm", "length", 0.001, 0},
    {"cm", "length", 0.01, 0},
    {"m", "length", 1, 0},
    {"km", "length", 1000, 0},
    {"in", "length", 0.0254, 0},
    {"ft", "length", 0.3048, 0},
    {"yd", "length", 0.9144, 0},
    {"mi", "length", 1609.344, 0},
    {"g", "mass", 0.001, 0},
    {"kg", "mass", 1, 0},
    {"oz", "mass", 0.028349523125, 0},
    {"lb", "mass", 0.45359237, 0},
    {"C", "temperature", 1, 273.15},
    {"F", "temperature", 5.0 / 9.0, 273.15 - 32 * 5.0 / 9.0},
    {"K", "temperature", 1, 0},
}};

const Unit* find_unit(std::string_view name) {
  for (const Unit& u : kUnits) {
    if (u.name == name) return &u;
  }
  return nullptr;
}

// The input schema, with the unit names taken from the table above.
std::string convert_schema() {
  std::string names;
  for (const Unit& u : kUnits) {
    names += names.empty() ? "\"" : ",\"";
    names += u.name;
    names += '"';
  }
  std::string unit = R"({"type":"string","enum":[)";
  unit += names;
  unit += "]}";
  std::string schema = R"({"type":"object","properties":{"value":{"type":"number"},"from":)";
  schema += unit;
  schema += R"(,"to":)";
  schema += unit;
  schema += R"(},"required":["value","from","to"],"additionalProperties":false})";
  return schema;
}

// Appends each piece to one string (cheaper than a chain of operator+).
template <typename... Pieces>
std::string concat(const Pieces&... pieces) {
  std::string out;
  (out.append(pieces), ...);
  return out;
}

// Twelve significant digits: hides binary rounding noise (212, not 211.99999999999997).
std::string format_number(double v) {
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::general, 12);
  return ec == std::errc() ? std::string(buf, end) : std::string("0");
}

struct ConvertInput {
  double value = 0;
  std::string from, to;
};

// The host calls a tool only with input that matched its schema, so the input here is
// one JSON object with exactly the members "value" (a number), "from" and "to" (unit
// names, ASCII). A reader for that shape is all the JSON parsing this plugin needs.
class InputReader {
 public:
  explicit InputReader(std::string_view text) : s_(text) {}

  bool read(ConvertInput& in) {
    if (!eat('{')) return false;
    do {
      std::string key;
      if (!string(key) || !eat(':')) return false;
      if (key == "value") {
        if (!number(in.value)) return false;
      } else if (key == "from" || key == "to") {
        if (!string(key == "from" ? in.from : in.to)) return false;
      } else {
        return false;
      }
    } while (eat(','));
    return eat('}');
  }

  const std::string& error() const { return error_; }

 private:
  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }

  bool eat(char c) {
    skip_space();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  bool string(std::string& out) {
    if (!eat('"')) return false;
    out.clear();
    while (pos_ < s_.size()) {
      const char c = s_[pos_++];
      if (c == '"') return true;
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (pos_ >= s_.size()) return false;
      switch (const char e = s_[pos_++]) {
        case 'u': {
          unsigned code = 0;
          if (s_.size() - pos_ < 4) return false;
          const auto [end, ec] = std::from_chars(s_.data() + pos_, s_.data() + pos_ + 4, code, 16);
          if (ec != std::errc() || end != s_.data() + pos_ + 4) return false;
          pos_ += 4;
          // Member and unit names are ASCII; any other character cannot match one.
          out.push_back(code < 0x80 ? static_cast<char>(code) : '?');
          break;
        }
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        default: out.push_back(e);  // '"', '\\' and '/'
      }
    }
    return false;
  }

  bool number(double& out) {
    skip_space();
    const char* begin = s_.data() + pos_;
    const auto [end, ec] = std::from_chars(begin, s_.data() + s_.size(), out);
    if (ec == std::errc::result_out_of_range) error_ = "value is out of range";
    if (ec != std::errc()) return false;
    pos_ += static_cast<std::size_t>(end - begin);
    return true;
  }

  std::string_view s_;
  std::size_t pos_ = 0;
  std::string error_ = "input is not the object the schema describes";
};

Result convert(Call& call) {
  ConvertInput in;
  InputReader reader(call.input());
  if (!reader.read(in)) return call.fail(reader.error());
  const Unit* from = find_unit(in.from);
  const Unit* to = find_unit(in.to);
  if (from == nullptr || to == nullptr) return call.fail("unknown unit");  // the schema's enum rules this out
  if (from->dimension != to->dimension) {
    return call.fail(
        concat("cannot convert ", from->name, " (", from->dimension, ") to ", to->name, " (", to->dimension, ")"));
  }
  const double base = in.value * from->scale + from->offset;
  if (from->dimension == "temperature" && base < 0) {
    return call.fail(concat(format_number(in.value), " ", from->name, " is below absolute zero"));
  }
  const double result = (base - to->offset) / to->scale;
  if (!std::isfinite(result)) return call.fail("the result is out of range");
  // Unit names need no escaping; a number is valid JSON as to_chars writes it.
  call.output(concat("{\"result\":", format_number(result), ",\"unit\":\"", to->name, "\"}"));
  return Result::ok;
}

Result list_units(Call& call) {
  std::string out = "{";
  std::string_view dimension;
  for (const Unit& u : kUnits) {
    if (u.dimension != dimension) {
      if (!dimension.empty()) out += "],";
      dimension = u.dimension;
      out += concat("\"", dimension, "\":[");
    } else {
      out += ',';
    }
    out += concat("\"", u.name, "\"");
  }
  out += "]}";
  call.output(out);
  return Result::ok;
}

void fill(Registry& r) {
  r.tool("AID.UNITS.CONVERT.v1", convert)
      .name("convert_units")
      .description(
          "Converts a value between units of length, mass or temperature "
          "(result rounded to 12 significant digits).")
      .input_schema(convert_schema())
      .deterministic()
      .tags({"units"})
      .replay_inputs();
  r.tool("AID.UNITS.LIST.v1", list_units)
      .name("list_units")
      .description("Lists the unit names convert_units accepts, by dimension.")
      .input_schema(R"({"type":"object","additionalProperties":false})")
      .deterministic()
      .tags({"units"})
      .replay_inputs();
}

}  // namespace

MACHINA_PLUGIN(fill)
