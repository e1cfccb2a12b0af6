// JSON-RPC 2.0 messages, one per line (the framing of MCP's stdio transport and of the
// skill protocol, docs/specifications.md): reading one line into its parts, with the raw JSON text of `id`, `params`,
// `result` and `error.data` cut out of the line (nothing re-encoded), and writing requests,
// notifications, results and errors. What the --mcp and --skill fronts and the skill and
// MCP-server runners speak.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>

namespace machina::jsonrpc {

/// The standard error codes.
enum Code : int {
  kParseError = -32700,
  kInvalidRequest = -32600,
  kMethodNotFound = -32601,
  kInvalidParams = -32602,
  kInternalError = -32603,
  kRequestCancelled = -32800,  // (LSP's; answered by no one here, named for completeness)
};

/// One member of a JSON object, as for_each_member() finds it.
struct Member {
  enum class Type { null, boolean, number, string, object, array };
  std::string_view key;  // decoded
  std::string_view raw;  // the value's JSON text, as written
  Type type = Type::null;
  std::string_view string;  // a string value, decoded
};

struct Message {
  enum class Kind {
    request,       // method and id
    notification,  // method, no id
    result,        // id and result
    error,         // id (maybe null) and error
    invalid        // JSON, but not a JSON-RPC 2.0 message: `why`
  };
  Kind kind = Kind::invalid;
  std::string_view id;  // the raw JSON of the id (a number or a string); "" when absent, "null" for null
  std::string method;
  std::string_view params;  // raw JSON of params; "" when absent
  std::string_view result;  // raw JSON of result
  int error_code = 0;
  std::string error_message;
  std::string_view error_data;  // raw JSON; "" when absent
  std::string why;              // (invalid)

  /// The members of `params` when it is an object of at most kParamsMembers members,
  /// found by the same parse (each_param() gives them; past that many it reads `params`
  /// again). A member's key and string are decoded; its raw text points into the line.
  struct ParamsMember {
    std::string key;
    std::string_view raw;
    Member::Type type = Member::Type::null;
    std::string string;
  };
  static constexpr std::size_t kParamsMembers = 8;
  std::array<ParamsMember, kParamsMembers> params_members;
  std::size_t params_member_count = 0;
  bool params_members_found = false;
  /// True when this parse showed that validate_json accepts `params` and every value in
  /// it as they stand (every string and key well-formed UTF-8 without control
  /// characters, every number within a double's range; the nesting is within the
  /// message's own limit): a front may then spare the host its own check of a value
  /// cut from params (Request::input_json_valid).
  bool params_valid_json = false;

  /// Back to a message of nothing, keeping the strings' memory (parse() starts with it:
  /// assigning a new Message costs a twentieth of a --mcp call). A field added above is
  /// reset there too.
  void clear();
};

/// Reads one message. False, with `why`, when the line is not JSON (a parse error);
/// true otherwise, with kind `invalid` for JSON that is not a message (a batch, no
/// "jsonrpc": "2.0", an id that is neither a number nor a string, a member of the message
/// or of its error given twice — then an `id` given twice is left out, ...).
bool parse(std::string_view line, Message& out, std::string& why);

/// Calls `each` for the members of the JSON object `text`, in order, until it returns
/// false. False, with `why`, when `text` is not a JSON object (or `each` stopped).
bool for_each_member(std::string_view text, const std::function<bool(const Member&)>& each, std::string& why);

/// for_each_member() over a parsed message's `params`, from what the parse found when it
/// could (no second pass over the text). (A template: `each` is called directly, not
/// wrapped in a std::function, whose closure was allocated on every call.)
template <class Each>
bool each_param(const Message& message, Each&& each, std::string& why) {
  if (!message.params_members_found) return for_each_member(message.params, each, why);
  for (std::size_t i = 0; i < message.params_member_count; ++i) {
    const auto& found = message.params_members[i];
    Member m;
    m.key = found.key;
    m.raw = found.raw;
    m.type = found.type;
    if (found.type == Member::Type::string) m.string = found.string;
    if (!each(std::as_const(m))) {
      why = "stopped";
      return false;
    }
  }
  return true;
}

/// The same for the elements of the JSON array `text` (each with an empty key).
bool for_each_element(std::string_view text, const std::function<bool(const Member&)>& each, std::string& why);

/// The raw id of the message whose first bytes are `head` (a line cut short: too large
/// to read whole), if its members up to the id are in it; "" otherwise.
std::string find_id(std::string_view head);

/// "an object", "a string", ... (for messages naming a value's type).
const char* type_name(Member::Type type);

/// Appends one line (with its '\n'). `id` and the JSON parts are raw JSON texts; an empty `id` makes a
/// notification.
void append_request(std::string& out, std::string_view id, std::string_view method, std::string_view params);
void append_notification(std::string& out, std::string_view method, std::string_view params);
void append_result(std::string& out, std::string_view id, std::string_view result);
void append_error(std::string& out, std::string_view id, int code, std::string_view message,
                  std::string_view data = {});

}  // namespace machina::jsonrpc
