// How the long-running fronts (--http, --nats) learn that they are to stop, and how they say
// that they serve: by default SIGINT or SIGTERM writes to an eventfd that their poll loops
// watch; a program that runs a front beside other work passes a descriptor of its own.
#pragma once

#include <functional>
#include <string_view>

namespace machina::cli {

/// Installs the SIGINT and SIGTERM handlers (once per process) and returns the eventfd they
/// write to: readable from the first signal on. -1 if no eventfd could be made.
int watch_stop_signals();

struct FrontControl {
  int stop_fd = -1;  // readable: stop serving (-1: on SIGINT or SIGTERM, watch_stop_signals)
  // Called once the front serves, with where: the HTTP front's URL, the NATS server's
  // (without credentials).
  std::function<void(std::string_view address)> on_serving;
};

/// The descriptor a front with `control` stops on.
int stop_fd_of(const FrontControl& control);

}  // namespace machina::cli
