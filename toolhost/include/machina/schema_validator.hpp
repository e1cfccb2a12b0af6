// Input validation against a tool's declared JSON Schema. Supports the subset tools
// need (type, properties, required, additionalProperties, items, enum, const,
// minimum/maximum and their exclusive forms, minLength/maxLength, minItems/maxItems,
// uniqueItems);
// a schema using any other validation keyword is refused when the tool registers,
// so nothing is silently left unchecked.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

namespace machina {

class SchemaValidator {
 public:
  /// Throws HostError if `schema_text` is not JSON or uses unsupported keywords.
  explicit SchemaValidator(const std::string& schema_text);

  /// Returns an empty optional if `instance` matches, else "at <pointer>: <why>".
  std::optional<std::string> validate(const nlohmann::json& instance) const;

  const nlohmann::json& schema() const { return schema_; }

 private:
  nlohmann::json schema_;
};

}  // namespace machina
