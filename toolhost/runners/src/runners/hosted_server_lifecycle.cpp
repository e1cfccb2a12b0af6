// See hosted_server.hpp: a hosted server's life: its data directory, the lifecycle and
// session notices of a skill, ticks and the pings that find a hung child (on a background
// thread), and its close (shutdown, a grace period, a kill).
#include "hosted_server_protocol.hpp"

#include <machina/clock.hpp>
#include <machina/errors.hpp>
#include <machina/runners/hosted_server.hpp>
#include <machina/state_home.hpp>

#include <cctype>
#include <chrono>
#include <filesystem>

namespace machina {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kMaxSessions = 1024;  // sessions under way a skill started again is told of

std::string default_data_dir(const std::string& name) {
  std::string safe;
  for (char c : name) safe.push_back(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ? c : '_');
  return toolhost_state_dir() + "/skills/" + safe;
}

}  // namespace

HostedServer::HostedServer(HostedServerOptions options) : options_(std::move(options)) {
  if (options_.dialect != HostedServerOptions::Dialect::mcp) {
    if (options_.data_dir.empty()) options_.data_dir = default_data_dir(options_.name);
    std::error_code ec;
    std::filesystem::create_directories(options_.data_dir, ec);
    if (ec)
      throw ConfigError("skill " + options_.name + ": cannot make its data directory " + options_.data_dir + ": " +
                        ec.message());
  }
  background_ = std::thread([this] { background_loop(); });
}

HostedServer::~HostedServer() {
  close();
  background_.join();
}

pid_t HostedServer::pid() const {
  std::lock_guard lock(mu_);
  return child_ && child_->alive() ? child_->pid() : 0;
}

void HostedServer::lifecycle(const char* lifecycle_method, const char* skill_method, const std::string& params) {
  std::shared_ptr<RpcChild> child;
  {
    std::lock_guard lock(mu_);
    child = child_;
  }
  lifecycle_on(child, lifecycle_method, skill_method, params);
}

void HostedServer::lifecycle_on(const std::shared_ptr<RpcChild>& child, const char* lifecycle_method,
                                const char* skill_method, const std::string& params) {
  if (options_.dialect == HostedServerOptions::Dialect::mcp) return;
  if (!child || !child->alive()) return;
  const char* method =
      options_.dialect == HostedServerOptions::Dialect::runtime_skill ? skill_method : lifecycle_method;
  const auto r = child->call(method, params, steady_now_ms() + 5'000);
  if (r.ending != RpcChild::Reply::Ending::result && r.ending != RpcChild::Reply::Ending::error && options_.on_event) {
    options_.on_event("skill " + options_.name + ": " + method + " got no answer (" + r.message + ")");
  }
}

void HostedServer::session_started(const std::string& id) {
  {
    std::lock_guard lock(mu_);
    if (sessions_.size() >= kMaxSessions) sessions_.erase(sessions_.begin());  // (bounded: one is forgotten)
    sessions_.insert(id);
  }
  lifecycle("lifecycle/onSessionStart", "skill/sessionStart", session_params(id));
}

void HostedServer::session_ended(const std::string& id) {
  {
    std::lock_guard lock(mu_);
    sessions_.erase(id);
  }
  lifecycle("lifecycle/onSessionEnd", "skill/sessionEnd", session_params(id));
}

void HostedServer::background_loop() {
  std::unique_lock lock(mu_);
  auto next_tick = steady_now_ms() + options_.tick_interval_ms;
  for (;;) {
    if (closed_) return;
    if (!to_probe_.empty()) {
      auto probe = std::move(to_probe_);
      to_probe_.clear();
      lock.unlock();
      for (auto& child : probe) {
        if (!child->alive()) continue;
        const auto r = child->call("ping", "{}", steady_now_ms() + options_.probe_timeout_ms);
        // Any answer, an error included, says it still reads and writes.
        if (r.ending == RpcChild::Reply::Ending::timed_out) {
          child->kill("hung: it did not answer a ping within " + std::to_string(options_.probe_timeout_ms) +
                      " ms after a call timed out, and was killed");
          if (options_.on_event) options_.on_event(std::string(kind()) + " " + options_.name + " hung and was killed");
        }
      }
      lock.lock();
      continue;
    }
    const bool ticking = options_.tick_interval_ms > 0 && options_.dialect != HostedServerOptions::Dialect::mcp;
    if (ticking && steady_now_ms() >= next_tick) {
      next_tick = steady_now_ms() + options_.tick_interval_ms;
      lock.unlock();
      lifecycle("lifecycle/onTick", "skill/tick", "{}");
      lock.lock();
      continue;
    }
    if (ticking)
      wake_.wait_until(lock, Clock::time_point(std::chrono::milliseconds(next_tick)));
    else
      wake_.wait(lock);
  }
}

void HostedServer::close() {
  std::shared_ptr<RpcChild> child;
  {
    std::lock_guard lock(mu_);
    if (closed_) return;
    closed_ = true;
    child = std::move(child_);
    wake_.notify_all();
  }
  if (!child || !child->alive()) return;
  if (options_.dialect != HostedServerOptions::Dialect::mcp) {
    const char* method =
        options_.dialect == HostedServerOptions::Dialect::runtime_skill ? "skill/shutdown" : "shutdown";
    child->call(method, "{}", steady_now_ms() + options_.shutdown_grace_ms);
  }
  child->finish(options_.shutdown_grace_ms);
}

}  // namespace machina
