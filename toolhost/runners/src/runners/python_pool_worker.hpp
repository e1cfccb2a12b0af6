// The parts of a PythonWorkerPool its two source files share: a call sent to a worker, a
// worker, and the note a lost worker's stderr adds to a message.
#pragma once

#include <machina/child_process.hpp>
#include <machina/runners/python_worker_pool.hpp>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

namespace machina {

/// One call sent to a worker (or about to be), waiting for its answer. Guarded by mu_.
struct PythonWorkerPool::Pending {
  enum class State { waiting, answered, failed, requeue, abandoned };
  std::int64_t deadline_ms = 0;
  State state = State::waiting;
  bool cancelled = false;  // by its caller (see cancel_call)
  const Retire* retire = nullptr;
  std::string caller;
  Exchange result;
  std::condition_variable cv;  // settled, or it may now read its worker's answers
};

/// One worker. Whoever waits for an answer from it reads its answers (one caller at a time:
/// `reading`), settling the calls they answer in order and handing the reading on, so that
/// an answer wakes only the caller it is for.
struct PythonWorkerPool::Worker {
  std::unique_ptr<ChildProcess> child;
  pid_t pid = 0;
  pid_t interpreter = 0;  // the interpreter's own pid (below a sandbox's launcher and init); 0: not yet found
  std::deque<std::shared_ptr<Pending>> queue;  // sent, not yet answered: the first is running
  std::mutex write_mu;                         // one request line written at a time
  std::string buffer;                          // read and not yet taken (by the reader)
  bool reading = false;                        // a caller is reading its answers
  bool dead = false;                           // killed or ended: takes no more calls
  bool settled = false;                        // its end was handled (lost())
  std::string kill_reason;                     // why it was killed, for the call it was running
  bool running_settled = false;                // the call it was running was answered at its deadline
  bool taken = false;                          // it has taken a call (of `caller`'s)
  std::string caller;                          // whose calls it takes, once taken
};

/// "; stderr: TAIL" for a message about a worker that ended ("" when it wrote nothing).
inline std::string tail_note(const std::string& tail) {
  std::string text = tail;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text.empty() ? "" : "; stderr: " + text;
}

}  // namespace machina
