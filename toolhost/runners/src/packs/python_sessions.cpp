// See python_pack.hpp: execute_python's REPL sessions. A session of one user keeps its
// code's names in one worker reserved for it, until it is idle too long, its code is killed
// or leaves threads running, or a new session needs its place.
#include "python_pack.hpp"

#include "python_files.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

namespace machina::packs {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

std::shared_ptr<PythonPack::ReplSession> PythonPack::acquire(Workspace& ws, std::string_view user,
                                                             const std::string& id, std::int64_t deadline_ms,
                                                             bool& fresh, Result& refusal) {
  const PythonPolicy& p = policy_.python;
  const std::string key = ws.scope + '\n' + std::string(user) + '\n' + id;
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::shared_ptr<ReplSession> s;
    std::shared_ptr<ReplSession> evicted;
    {
      std::lock_guard lock(sessions_mu_);
      if (auto it = sessions_.find(key); it != sessions_.end()) {
        s = it->second;
        ++s->holders;
        fresh = false;
      } else {
        if (p.max_sessions == 0) {
          refusal = denied(
              "the policy allows no Python session ([python] max_sessions = 0); run the code without a "
              "session_id");
          return nullptr;
        }
        if (sessions_.size() >= p.max_sessions) {
          // Room is made by ending the session unused the longest; one running a call is never ended.
          for (auto& [_, other] : sessions_) {
            if (other->holders == 0 && (!evicted || other->last_used < evicted->last_used)) evicted = other;
          }
          if (!evicted) {
            refusal = system_error("all " + std::to_string(p.max_sessions) +
                                   " Python sessions the policy allows are running calls; try again when one is done, "
                                   "or run the code without a session_id");
            return nullptr;
          }
          evicted->ended = true;
          sessions_.erase(evicted->key);
        }
        s = std::make_shared<ReplSession>();
        s->key = key;
        s->id = id;
        s->dir = ws.sessions + "/" + std::to_string(++ws.serial) + "-" + id;
        s->holders = 1;
        s->last_used = Clock::now();
        s->running.lock();  // (free: nobody else has it yet)
        sessions_.emplace(key, s);
        fresh = true;
        if (!reaper_.joinable()) reaper_ = std::thread([this] { reap_loop(); });
        sessions_cv_.notify_all();
      }
    }
    if (evicted) end_session(evicted);
    if (fresh) {
      std::string why;
      if (!python_files::make_dirs(s->dir, why)) {
        release(s, false);
        refusal = system_error("a folder for session " + id + " cannot be made: " + why);
        return nullptr;
      }
      s->pool = make_pool(ws, s->dir, 1);
      return s;
    }
    if (!s->running.try_lock_until(Clock::time_point(std::chrono::milliseconds(deadline_ms)))) {
      std::lock_guard lock(sessions_mu_);
      --s->holders;
      refusal = Result::stopped(RunOutcome::Ending::timed_out,
                                "Python session " + id + " was running another call until the deadline");
      return nullptr;
    }
    bool ended = false;
    {
      std::lock_guard lock(sessions_mu_);
      ended = s->ended;
      if (ended) --s->holders;
    }
    if (!ended) return s;
    s->running.unlock();  // it ended while this call waited: a new one
  }
  refusal = system_error("Python session " + id + " kept ending while this call waited for it");
  return nullptr;
}

void PythonPack::release(const std::shared_ptr<ReplSession>& s, bool keep) {
  if (!keep) end_session(s);
  {
    std::lock_guard lock(sessions_mu_);
    s->last_used = Clock::now();
    --s->holders;
  }
  s->running.unlock();
  sessions_cv_.notify_all();
}

void PythonPack::end_session(const std::shared_ptr<ReplSession>& s) {
  {
    std::lock_guard lock(sessions_mu_);
    if (auto it = sessions_.find(s->key); it != sessions_.end() && it->second == s) sessions_.erase(it);
    s->ended = true;
  }
  // Its worker is gone before its folder is (nothing left to write into it).
  auto pool = std::move(s->pool);
  if (pool) pool->close();
  pool.reset();
  std::string why;
  python_files::remove_tree(s->dir, why);
}

void PythonPack::reap_loop() {
  std::unique_lock lock(sessions_mu_);
  while (!stop_reaper_) {
    const auto idle = std::chrono::milliseconds(policy_.python.session_idle_ms);
    const auto now = Clock::now();
    std::vector<std::shared_ptr<ReplSession>> expired;
    auto next = now + std::chrono::hours(1);
    for (auto& [_, s] : sessions_) {
      if (s->holders != 0) continue;  // (released: it is looked at again then)
      if (now - s->last_used >= idle)
        expired.push_back(s);
      else
        next = std::min(next, s->last_used + idle);
    }
    if (!expired.empty()) {
      for (auto& s : expired) {
        s->ended = true;
        sessions_.erase(s->key);
      }
      lock.unlock();
      for (auto& s : expired) end_session(s);
      lock.lock();
      continue;
    }
    sessions_cv_.wait_until(lock, next);
  }
}

}  // namespace machina::packs
