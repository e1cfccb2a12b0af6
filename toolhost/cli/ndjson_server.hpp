// The --serve front: NDJSON requests on one fd, one response line per request on
// another. Single-threaded by default (responses in request order); with workers,
// calls run concurrently and a response with an id may overtake earlier ones, while
// responses without an id keep request order.
#pragma once

#include <chrono>

#include <machina/host.hpp>

namespace machina::cli {

struct ServeOptions {
  int in_fd = 0;
  int out_fd = 1;
  unsigned workers = 1;
  std::size_t max_in_flight = 1024;  // bound on requests read but not yet answered
  std::chrono::microseconds spin{0};  // how long to poll for the next request before sleeping
};

/// Serves until end of input; returns the process exit code.
int serve(Host& host, const ServeOptions& options);

/// The --run front: one request from in_fd, one response to out_fd.
int run_once(Host& host, std::string_view aid, int in_fd, int out_fd);

/// Writes all of `data`; false if the reader is gone.
bool write_all(int fd, std::string_view data);

}  // namespace machina::cli
