// A long-running front (--http, --nats) for the unit tests of the fronts: serving on a thread
// of its own with the echo tools, stopped through an eventfd of the test's, and the exit code
// it returned.
#pragma once

#include "echo_tools.hpp"

#include "../../toolhost/cli/stop_signal.hpp"

#include <machina/tool_host.hpp>

#include <doctest/doctest.h>

#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <string>
#include <thread>

namespace machina::test {

class FrontRunner {
 public:
  /// Starts `serve(host, control)` on a thread; returns once the front says it serves, with
  /// where in address().
  using Serve = std::function<int(Host& host, const cli::FrontControl& control)>;
  explicit FrontRunner(Serve serve) : tools_(HostOptions{}) {
    tools_.add_linked_plugin(echo_tools());
    stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    REQUIRE(stop_fd_ >= 0);
    control_.stop_fd = stop_fd_;
    auto address = serving_.get_future();
    control_.on_serving = [this](std::string_view where) { serving_.set_value(std::string(where)); };
    thread_ = std::thread([this, serve = std::move(serve)] {
      try {
        exit_code_ = serve(tools_.host(), control_);
      } catch (const std::exception& e) {
        failure_ = e.what();
      }
      done_.set_value();
    });
    done_future_ = done_.get_future().share();
    // Either the front serves, or it ended (and says why).
    for (;;) {
      if (address.wait_for(std::chrono::milliseconds(10)) == std::future_status::ready) {
        address_ = address.get();
        break;
      }
      if (done_future_.wait_for(std::chrono::milliseconds(0)) == std::future_status::ready) {
        thread_.join();
        ::close(stop_fd_);
        FAIL("the front ended before it served: " << failure_);
      }
    }
  }
  ~FrontRunner() {
    if (thread_.joinable()) {  // (a case that failed before its own stop(): no check here)
      const std::uint64_t one = 1;
      (void)!::write(stop_fd_, &one, sizeof one);
      thread_.join();
    }
    ::close(stop_fd_);
  }
  FrontRunner(const FrontRunner&) = delete;
  FrontRunner& operator=(const FrontRunner&) = delete;

  /// Tells the front to stop and waits (at most 30 s) until it returns; its exit code.
  int stop() {
    const std::uint64_t one = 1;
    REQUIRE(::write(stop_fd_, &one, sizeof one) == static_cast<ssize_t>(sizeof one));
    REQUIRE(done_future_.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
    thread_.join();
    CHECK(failure_.empty());
    return exit_code_;
  }

  const std::string& address() const { return address_; }

 private:
  ToolHost tools_;
  int stop_fd_ = -1;
  std::promise<std::string> serving_;
  cli::FrontControl control_;
  std::promise<void> done_;
  std::shared_future<void> done_future_;
  std::thread thread_;
  std::string address_;
  std::string failure_;
  int exit_code_ = -1;
};

}  // namespace machina::test
