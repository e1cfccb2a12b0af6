// The NATS front's durable mode (`--nats-durable`): calls taken from a JetStream work-queue
// stream through one durable pull consumer shared by the hosts, explicit acks. A host fetches
// only as many messages as it has workers free, tells the server it is still working on each
// while its call runs, publishes the answer to the message's Machina-Reply-To subject and
// then acknowledges it. A call without an idempotency key runs under its message id, so a
// redelivery replays the answer instead of running the tool again. docs/nats.md.
#pragma once

#include "nats_front.hpp"

#include <nats/nats.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

namespace machina::cli {

/// The durable mode's subject for calls under `prefix`.
std::string durable_subject(const std::string& prefix);

class DurableConsumer;

/// A message in the stream, the same in each of its deliveries: its sequence and the time it
/// was stored (a stream made again numbers from 1 again). {0, 0}: unknown.
struct StoredMessage {
  std::uint64_t sequence = 0;
  std::int64_t stored_ns = 0;
  bool known() const { return sequence != 0; }
  bool operator==(const StoredMessage&) const = default;
};

struct StoredMessageHash {
  std::size_t operator()(const StoredMessage& m) const {
    return std::hash<std::uint64_t>()(m.sequence * 0x9E3779B97F4A7C15ULL ^ static_cast<std::uint64_t>(m.stored_ns));
  }
};

/// One message taken from the stream while its call is answered: the server hears that it
/// is in progress until it is acknowledged. Dropped unacknowledged, the message is released
/// and the server delivers it again after the ack wait.
class DurableReceipt {
 public:
  DurableReceipt(DurableConsumer& consumer, natsMsg* msg);
  ~DurableReceipt();
  DurableReceipt(const DurableReceipt&) = delete;
  DurableReceipt& operator=(const DurableReceipt&) = delete;

  /// The message id the answer names in its Machina-Request-Id header.
  const std::string& request_id() const { return request_id_; }
  /// Acknowledges the message (its answer is published): the stream forgets it.
  void acknowledge();

 private:
  DurableConsumer* consumer_;  // nullptr once acknowledged or released
  natsMsg* msg_;
  StoredMessage stored_;
  std::string request_id_;
};

/// What the durable consumer asks of the front it feeds.
class DurableSink {
 public:
  virtual ~DurableSink() = default;
  /// Serves `call` (its reply subject is where the answer goes) as a call on the durable
  /// endpoint, then acknowledges `receipt`. May block while every worker has a call waiting.
  virtual void serve_durable(natsMsg* call, std::unique_ptr<DurableReceipt> receipt) = 0;
  /// Workers with no call running or waiting, after waiting up to `wait` for one to be.
  virtual std::size_t idle_workers(std::chrono::milliseconds wait) = 0;
};

/// The stream, the consumer and the thread that fetches from it (see the file comment).
class DurableConsumer {
 public:
  DurableConsumer(natsConnection* nc, const NatsFrontOptions& options, DurableSink& sink);
  /// Stops fetching and keeping messages in progress. Every receipt is gone by then.
  ~DurableConsumer();
  DurableConsumer(const DurableConsumer&) = delete;
  DurableConsumer& operator=(const DurableConsumer&) = delete;

  /// Makes (or updates) the stream and the consumer and starts fetching. Throws ConfigError.
  void start();
  /// Fetches no more; returns once the messages fetched are handed to the sink.
  void stop_fetching();

 private:
  friend class DurableReceipt;
  void ensure_stream_and_consumer();
  void fetch_loop();
  void keep_in_progress();
  /// One message fetched: served; or acknowledged unserved when its answer could go nowhere
  /// or this host answered it already; or dropped when this host is answering it.
  void dispatch(natsMsg* msg);
  void hold(natsMsg* msg, StoredMessage stored);
  /// `msg` leaves the messages kept in progress (and with `answered`, it is remembered as
  /// answered); true if it was among them.
  bool release(natsMsg* msg, bool answered);

  natsConnection* nc_;
  const NatsFrontOptions& o_;
  DurableSink& sink_;
  std::string subject_;
  jsCtx* js_ = nullptr;
  natsSubscription* sub_ = nullptr;

  std::mutex mu_;
  std::condition_variable changed_;
  std::unordered_map<natsMsg*, StoredMessage> held_;  // fetched, not yet acknowledged or released
  // The messages this host answered lately (a delivery of one again is acknowledged and not
  // answered twice), oldest first, for as long as the server may deliver them again.
  std::unordered_set<StoredMessage, StoredMessageHash> answered_;
  std::deque<std::pair<std::chrono::steady_clock::time_point, StoredMessage>> answered_order_;
  bool stop_fetching_ = false, stop_ticking_ = false;
  std::thread fetcher_, ticker_;
};

}  // namespace machina::cli
