// The tool list as JSON, made in one place for every front that shows it (--list,
// _core.Host.list_tools, GET /tools of --http, PREFIX.tools of --nats): per tool its aid,
// name, description, declared input schema, determinism, tags, side effects, replayability,
// tier, the deadline a call gets by default, where it comes from and which runner runs it;
// the schema and annotations a front advertises come from it by tool_names.hpp's rules.
#pragma once

#include <machina/host.hpp>

#include <string>

namespace machina {

/// A JSON array with one object per registered tool, in registration order.
std::string tool_list_json(const Host& host);

}  // namespace machina
