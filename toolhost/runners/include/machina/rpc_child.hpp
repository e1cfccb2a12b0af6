// A child process spoken to in JSON-RPC 2.0, one message per line on its stdin and stdout
// (a skill, an MCP server over stdio): many requests in flight, matched by id; the
// child's own requests answered by a handler and its notifications handed to another; the
// child's stderr kept as a bounded tail. A child that writes something that is not a
// message, a line over the cap, or ends, fails every call in flight on it (`crashed`);
// its owner decides whether to start another.
//
// Who reads the child's output: one thread at a time holds the reading turn. A caller
// waiting for its answer takes the turn when it is free and reads answers for everyone (so
// a lone call costs no hand-over between threads: on one CPU, four thread switches fewer);
// it passes the turn to another waiting caller once its own answer is in, its deadline has
// passed or it is cancelled. A watch thread takes the turn when no caller has for a little
// while (kIdleTakeover), so that what the child writes between calls is still read at once,
// and whenever a caller comes upon what only the watch thread handles: the child's requests
// and notifications (their handlers may take a while) and the end of its output. A caller
// that needs the turn while the watch thread idles in it asks it to give it up.
#pragma once

#include <machina/child_process.hpp>
#include <machina/jsonrpc.hpp>
#include <machina/request.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace machina {

struct RpcChildOptions {
  std::vector<std::string> argv;           // the whole command: a sandbox's launcher first, if any
  std::vector<std::string> env;            // its whole environment
  std::string cwd;                         // "" for ours
  std::size_t max_line_bytes = 16u << 20;  // longest message read
  std::size_t stderr_tail_bytes = 4096;
  std::string name;  // names it in events ("skill weather")
  // Told of what the host's operator should hear (an answer dropped: see stray_answers()).
  std::function<void(std::string_view)> on_event;
};

class RpcChild {
 public:
  /// A request of the child's: append exactly one response line (jsonrpc::append_result /
  /// append_error) to `reply`. Called by the thread reading (see above), one call at a time.
  using RequestHandler = std::function<void(const jsonrpc::Message& request, std::string& reply)>;
  /// A notification of the child's (progress, log messages ...). By the thread reading.
  using NotificationHandler = std::function<void(const jsonrpc::Message& notification)>;

  struct Reply {
    enum class Ending { result, error, timed_out, cancelled, crashed, closed };
    Ending ending = Ending::result;
    std::string result;   // raw JSON (result)
    int code = 0;         // (error)
    std::string message;  // (error), or what happened (timed_out, crashed, closed)
    std::string data;     // raw JSON of error.data, if any
  };

  /// Starts the child (on `spawner`'s thread, for PR_SET_PDEATHSIG) and its watch thread.
  /// Throws as ChildProcess does.
  RpcChild(RpcChildOptions options, RequestHandler on_request, NotificationHandler on_notification,
           Spawner* spawner = nullptr);
  /// Kills the child if it still runs; every call in flight ends `closed`.
  ~RpcChild();
  RpcChild(const RpcChild&) = delete;
  RpcChild& operator=(const RpcChild&) = delete;

  /// Sends a request and waits for its answer until `deadline_ms` (steady_now_ms). `sent`
  /// (if given) gets the request's id just before it is written. With a `cancel` token the call
  /// can be given up at once (`cancelled`; the owner tells the child). Thread-safe.
  Reply call(std::string_view method, std::string_view params, std::int64_t deadline_ms, CancelToken* cancel = nullptr,
             const std::function<void(std::int64_t id)>& sent = {});
  /// Sends a notification; false if the child is gone. Thread-safe.
  bool notify(std::string_view method, std::string_view params);

  /// Kills the child; calls in flight end `crashed` with `why`.
  void kill(const std::string& why);
  /// Closes its input (end of input: a polite child leaves), waits up to `grace_ms` for it
  /// to end, then kills it.
  void finish(std::int64_t grace_ms);
  /// Whether it still runs (its output is open).
  bool alive() const;
  /// Calls waiting for an answer.
  std::size_t in_flight() const;
  pid_t pid() const { return child_->pid(); }
  std::string tail() const { return child_->tail(); }
  /// How it ended ("" while it runs).
  std::string ended_how() const;
  /// Answers read by the caller waiting for them or by another caller (the rest: by the
  /// watch thread, which wakes the caller).
  std::uint64_t answers_read_by_callers() const;
  /// Answers dropped because their id was not a request in flight when the child began to
  /// write them (an id not sent yet: a child cannot answer a call before it is made). Each
  /// is told to on_event (the first ten, then one in a thousand). Answers that come after
  /// their call gave up (its deadline, a cancellation) are dropped without a word.
  std::uint64_t stray_answers() const;

 private:
  struct Pending {
    Reply reply;
    std::uint64_t sent_after = 0;   // of the child's output, the bytes read before its id was given out
    std::atomic<bool> done{false};  // set under mu_; read without it by the thread reading
    bool waiting = false;           // its caller waits on cv (not reading, not still writing)
    std::condition_variable cv;
  };
  /// With the reading turn: handles the whole lines left by the last reader, or else waits
  /// up to `timeout_ms` (-1: until something comes or wake_reader() is called) for the
  /// child's output and handles its whole lines — stopping, for a caller (`mine`), once its
  /// own call is over or `deadline_ms` has passed. At the end of the output the watch
  /// thread fails every call in flight. A failure to handle what the child wrote kills it.
  /// `for_watch`: what comes next (a request or notification of the child's, the end of its
  /// output) is the watch thread's to handle.
  enum class Read { more, for_watch };
  Read read_some(int timeout_ms, const Pending* mine, std::int64_t deadline_ms) noexcept;
  enum class Handled { done, killed, for_watch };
  /// One line of the child's (`killed`: it killed the child for it). A caller reading
  /// (`by_caller`) leaves the child's requests and notifications to the watch thread
  /// (`for_watch`): their handlers may take a while.
  /// `at`: where the line's message begins in the child's whole output.
  Handled handle_line(std::string_view line, bool by_caller, std::uint64_t at);
  /// An answer to no request in flight: counted, and told.
  void stray_answer(std::int64_t id, std::uint64_t count) const;
  /// The output ended: how, and every call in flight failed.
  void ended();
  /// The watch thread: holds the reading turn while no caller has for kIdleTakeover.
  void watch();
  /// With mu_ held, the turn free: a caller waiting for its answer, to be told (after mu_
  /// is released) that it may read.
  std::shared_ptr<Pending> next_reader() const;
  /// Makes the thread reading return from read_some().
  void wake_reader() const;
  /// With mu_ held: fails every call in flight and marks the child gone.
  void fail_all(Reply::Ending ending, const std::string& why);
  bool write_line(std::string_view line, std::int64_t deadline_ms);

  RpcChildOptions options_;
  RequestHandler on_request_;
  NotificationHandler on_notification_;
  std::unique_ptr<ChildProcess> child_;
  int wake_fd_ = -1;  // an eventfd in the reader's poll set
  mutable std::mutex mu_;
  std::map<std::int64_t, std::shared_ptr<Pending>> pending_;
  std::int64_t next_id_ = 1;
  std::uint64_t answers_read_by_callers_ = 0;
  std::uint64_t stray_answers_ = 0;
  // Of the child's output, the bytes read so far (by the reader; read by callers as they
  // give out an id).
  std::atomic<std::uint64_t> bytes_read_{0};
  bool gone_ = false;   // no call goes to it any more
  bool ended_ = false;  // its output has ended (it is reaped)
  std::string how_;
  bool reading_ = false;        // a thread holds the reading turn
  bool watch_reading_ = false;  // ... the watch thread
  bool watch_woken_ = false;    // ... and it was asked to give it up
  bool stopping_ = false;       // the watch thread leaves
  bool watch_wanted_ = false;   // what was read next is the watch thread's to handle
  std::chrono::steady_clock::time_point turn_free_since_{};
  std::condition_variable watch_cv_;
  // The reader's (whoever holds the turn): a line begun (no newline before clean_), and
  // the chunk read into.
  std::string buffer_;
  std::size_t clean_ = 0;
  std::uint64_t buffer_at_ = 0;  // where buffer_ begins in the child's whole output
  std::unique_ptr<char[]> chunk_;
  std::mutex write_mu_;
  std::thread watch_;
};

}  // namespace machina
