// The NATS front's connection socket, read and written by a thread of the front's own (the
// NATS C client's external event loop) in place of the client's reader and flusher
// threads, so that the front decides when replies go out: a reply published while other
// calls are still being answered waits for theirs (one write for many), and the reply of
// the last call under way is written at once by the thread that published it. Whatever
// else the client writes (protocol, discovery, acknowledgements) goes out as soon as the
// loop's thread gets to it.
#pragma once

#include <nats/nats.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <thread>

namespace machina::cli {

class NatsEventLoop {
 public:
  NatsEventLoop();
  ~NatsEventLoop();  // stops the thread
  NatsEventLoop(const NatsEventLoop&) = delete;
  NatsEventLoop& operator=(const NatsEventLoop&) = delete;

  /// Starts the thread and sets `opts` so that a connection made with them is driven by it;
  /// `after_read` runs on that thread after each read from the socket and after poke().
  natsStatus attach_to(natsOptions* opts, std::function<void()> after_read);
  /// Has the thread run `after_read` soon.
  void poke();
  /// Ends the thread; call after natsConnection_Close and before natsConnection_Destroy.
  void stop();

  /// While it lives, what the constructing thread publishes stays in the client's buffer
  /// until settle() (or, if settle() is not called, the loop's next pass).
  class Held {
   public:
    explicit Held(NatsEventLoop& loop);
    ~Held();
    Held(const Held&) = delete;
    Held& operator=(const Held&) = delete;
    /// `last` (no other call is being answered): writes what is buffered now, on this
    /// thread; otherwise the loop's thread writes it, with what others publish meanwhile.
    void settle(natsConnection* nc, bool last);

   private:
    NatsEventLoop& loop_;
  };

 private:
  static natsStatus on_attach(void** user, void* loop, natsConnection* nc, natsSock fd);
  static natsStatus on_read(void* user, bool add);
  static natsStatus on_write(void* user, bool add);
  static natsStatus on_detach(void* user);
  void want_write();
  /// Writes what the client holds for the socket; true when nothing is left.
  bool write_buffered(natsConnection* nc);
  void watch();  // with mu_ held
  void run();

  int epoll_fd_ = -1;
  int stop_fd_ = -1;
  int poke_fd_ = -1;
  std::function<void()> after_read_;
  std::thread thread_;
  std::atomic<natsConnection*> nc_{nullptr};
  std::mutex write_mu_;  // one writer at a time
  std::mutex mu_;        // the socket's registration
  int fd_ = -1, registered_fd_ = -1;
  bool reading_ = false, writing_ = false;
};

}  // namespace machina::cli
