// What a hosted server's answers become: a tool's output from a tools/call result (its
// structuredContent, its text, or its content blocks) and the text of an error's content.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace machina::remote_output {

/// A JSON value as text: a string as it is, anything else as JSON.
std::string text_of(const nlohmann::json& v);
/// The text of a result's content: a string, or the text blocks of a list of content
/// blocks, one after the other.
std::string content_text(const nlohmann::json& content);
/// A tool's output from a tools/call result: structuredContent when there is one; a
/// string content or a single text block as a JSON string; other content as the list of
/// its blocks; a result without content as it is.
std::string output_of(const nlohmann::json& result);
/// output_of() without a DOM, for the results of every shape but an error: the output is a
/// span of the answer's own JSON text (structuredContent, a string content, a single text
/// block's text, the content list). False for an isError result (or one not an object).
bool fast_output(std::string_view result, std::string& output);

}  // namespace machina::remote_output
