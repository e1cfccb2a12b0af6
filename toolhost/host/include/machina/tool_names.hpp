// The names a tool answers to and the schema it is advertised with, one rule each for every
// front (--http, --mcp, --skill, --nats, --list, _core and machina_dispatch.llm).
//
// A name stands for the tool whose aid it is (an alias's aid and a `tools.*` name are aids of
// their own), else for the tool whose display name (ToolInfo::name) it is when no other tool
// has that name, else for the tool the LLM function-calling formats declare under it
// (docs/llm-tools.md, "Names"). A tool is advertised with one input schema, description and
// set of MCP annotations, whichever front lists it.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace machina {

struct Tool;
struct ToolInfo;

/// Whether the LLM formats take `aid` as it is, each '.' turned into '-': 1 to 64 letters,
/// digits, '_' and '.'. That mapping is one to one (such an aid has no '-').
bool plain_llm_name(std::string_view aid);

/// The function name the LLM formats declare `aid` under: a plain aid with each '.' as '-';
/// any other aid its nearest allowed form (each '.' as '-', each other UTF-8 character that
/// is not a letter, digit, '_' or '-' as one '_') cut to 51 bytes, then '-' and the first 12
/// hex digits of SHA-256("<salt>:<aid>") ("tool-" and those digits for an empty aid). At most
/// 64 bytes of letters, digits, '_' and '-'. Bytes that are not UTF-8 count one character each.
std::string llm_function_name(std::string_view aid, unsigned salt = 0);

/// The function names of `aids`, in their order, all distinct: a plain aid keeps its name;
/// the others, in order, take the first salt whose name no aid of the list has taken. An aid
/// given twice gets the same name twice.
std::vector<std::string> llm_function_names(const std::vector<std::string_view>& aids);

/// Every name a registry's tools answer to besides their aids. Not thread-safe by itself:
/// the registry rebuilds it under its lock and reads it under its shared lock.
class ToolNames {
 public:
  /// Indexes `tools`, every registered tool in registration order.
  void rebuild(const std::vector<const Tool*>& tools);

  struct Found {
    const Tool* tool = nullptr;
    std::vector<const Tool*> sharing;  // no tool found: the tools whose display name it is, when several
  };
  /// The tool a name that is no aid stands for: the one tool with that display name, else
  /// the tool with that LLM function name.
  Found find(std::string_view name) const;
  /// The LLM function name of a tool of the registry ("" for a tool it does not hold).
  std::string llm_name(const Tool& tool) const;

 private:
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, std::vector<const Tool*>, Hash, std::equal_to<>> by_display_name_;
  std::unordered_map<std::string, const Tool*, Hash, std::equal_to<>> by_llm_name_;
  std::unordered_map<const Tool*, std::string> llm_name_of_;
};

/// The schema text a tool declares: its checked input schema, else the one listed for it.
const std::string& declared_input_schema(const ToolInfo& info);

/// The input schema a tool is advertised with (MCP's inputSchema, a skill's parameters, the
/// LLM formats' parameters): `schema_text` when it is a JSON object whose "type" is
/// "object", else {"type": "object"}, any object (no format takes another kind).
nlohmann::ordered_json advertised_input_schema(std::string_view schema_text);
nlohmann::ordered_json advertised_input_schema(const ToolInfo& info);

/// The output schema MCP lists: the tool's when it is an object schema, else null.
nlohmann::ordered_json advertised_output_schema(const ToolInfo& info);

/// A tool's MCP annotations. The host's view comes from the tier (0 safe, 1 write, 2 system,
/// 3 dangerous) and the declared side effects. A hosted server's own annotations are shown
/// where they claim no less than that view: clients approve read-only tools without asking,
/// so a tool the operator declared with a tier or side effects is never shown read-only, and
/// one of tier 2 or more is shown destructive, whatever its server says.
nlohmann::ordered_json advertised_annotations(const ToolInfo& info);

}  // namespace machina
