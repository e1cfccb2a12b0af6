// A request's ds_state object on its own, decoded and encoded (the NDJSON wire carries it
// inside requests and responses; _core and the fuzz target use it alone).
#pragma once

#include <machina/request.hpp>

#include <string>
#include <string_view>

namespace machina {

/// Decodes a ds_state object: false, with `why`, when it is not one.
bool decode_ds_state(std::string_view text, DsUpdate& update, std::string& why);

/// Appends a ds_state report (the slots a call set and removed, or the full state) as a
/// JSON object.
void encode_ds_state(const DsReport& report, std::string& out);

}  // namespace machina
