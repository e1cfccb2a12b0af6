// Input validation against a tool's declared JSON Schema. Supports the subset tools
// need (type, properties, required, additionalProperties, items, enum, const,
// minimum/maximum and their exclusive forms, minLength/maxLength, minItems/maxItems,
// uniqueItems);
// a schema using any other validation keyword is refused when the tool registers,
// so nothing is silently left unchecked.
#pragma once

#include <nlohmann/json.hpp>

#include <mutex>
#include <optional>
#include <string>

namespace machina {

class SchemaValidator {
 public:
  /// Throws ConfigError if `schema_text` is not JSON or uses unsupported keywords. The
  /// check is cheap (no DOM of the validator's kind is built): loading a plugin costs
  /// little, and a schema is compiled only when its tool is first called.
  explicit SchemaValidator(std::string schema_text);
  SchemaValidator(const SchemaValidator&) = delete;
  SchemaValidator& operator=(const SchemaValidator&) = delete;

  /// Returns an empty optional if `instance` matches, else "at <pointer>: <why>".
  /// Thread-safe.
  std::optional<std::string> validate(const nlohmann::json& instance) const;

 private:
  const nlohmann::json& compiled() const;

  std::string text_;
  mutable std::once_flag once_;
  mutable nlohmann::json schema_;
};

}  // namespace machina
