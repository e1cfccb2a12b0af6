// How the long-running fronts (--http, --nats) learn that they are to stop: SIGINT or
// SIGTERM writes to an eventfd that their poll loops watch.
#pragma once

namespace machina::cli {

/// Installs the SIGINT and SIGTERM handlers (once per process) and returns the eventfd they
/// write to: readable from the first signal on. -1 if no eventfd could be made.
int watch_stop_signals();

}  // namespace machina::cli
