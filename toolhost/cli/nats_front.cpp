// See nats_front.hpp.
#include "nats_front.hpp"

#include "nats_event_loop.hpp"

#include "nats_durable.hpp"
#include "nats_kv_store.hpp"
#include "nats_message_forms.hpp"
#include "nats_service_info.hpp"
#include "nats_subjects.hpp"
#include "say.hpp"
#include "stop_signal.hpp"

#include <machina/errors.hpp>
#include <machina/ndjson_front.hpp>
#include <machina/ndjson_wire.hpp>
#include <machina/tool_list.hpp>

#include <nats/nats.h>
#include <nlohmann/json.hpp>

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

namespace machina::cli {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr FrontLabel kNatsFront{"nats", /*local_caller=*/false};  // (a network peer)
constexpr char kHdrRequestId[] = "Machina-Request-Id";            // durable mode: the message an answer is for
constexpr char kToolsWildcard[] = "tools.>";
constexpr std::int64_t kConnectTimeoutMs = 2000;
constexpr std::int64_t kFlushTimeoutMs = 2000;

class NatsServer;

/// One message taken: what the host is asked and how its answer goes back. Also the
/// overrun sink that answers a call whose inline tool overran its deadline.
struct Call final : OverrunSink {
  NatsServer* server = nullptr;
  Endpoint* ep = nullptr;
  natsMsg* msg = nullptr;
  natsSubscription* from = nullptr;  // the subscription it came on (none: the durable consumer)
  Clock::time_point start;
  MessageCall asks;                    // what the message asks the host
  std::atomic<bool> delivered{false};  // the overrun sink has sent the answer

  std::unique_ptr<DurableReceipt> receipt;  // durable mode: acknowledged once answered

  ~Call() override { natsMsg_Destroy(msg); }
  void deliver(Response response) override;
};

class NatsServer final : public DurableSink {
 public:
  NatsServer(Host& host, const NatsFrontOptions& o, const FrontControl& control)
      : host_(host), o_(o), control_(control) {}
  ~NatsServer();
  int run();
  /// Sends the answer to `call` for the host's response line `line`.
  void finish(Call& call, std::string_view line);
  /// Starts a worker thread; `replacing`: in place of one left inside a tool past its
  /// call's deadline (which is no longer counted).
  void add_worker(bool replacing = false);
  /// The call's answer went out through the overrun sink.
  void released_by_takeover();

 private:
  struct Subscription {
    NatsServer* server;
    Endpoint* ep;  // nullptr: the `tools.` wildcard, routed by subject
    natsSubscription* sub = nullptr;
  };
  static void on_discovery(natsConnection*, natsSubscription*, natsMsg* msg, void* closure);
  static void on_error(natsConnection*, natsSubscription*, natsStatus s, void*);
  void take(Endpoint* ep, natsMsg* msg, std::unique_ptr<DurableReceipt> receipt = nullptr);
  void serve_durable(natsMsg* call, std::unique_ptr<DurableReceipt> receipt) override;
  std::size_t idle_workers(std::chrono::milliseconds wait) override;
  void work();
  /// The call for a message taken from `s`; null when it is answered (or dropped) here.
  std::unique_ptr<Call> route(const Subscription& s, natsMsg* msg);
  std::unique_ptr<Call> make_call(Endpoint* ep, natsMsg* msg);
  /// On the event loop's thread: moves what the subscriptions hold to the workers' queue,
  /// as much as it has room for (a worker asks for more when it empties).
  void dispatch();
  /// After the subscriptions' drain began: what they still hold is taken, and their drain
  /// completes once they are read empty.
  void finish_drain();
  /// Answers one call; false when its answer went through the overrun sink, the thread having
  /// been left in the tool (it then touches nothing of this server's).
  bool serve_one(std::unique_ptr<Call> call);
  /// finish() and the call's count, the reply written at once when no other call is being
  /// answered, else with the next ones (NatsEventLoop).
  void answer(Call& call, std::string_view line);
  void publish(const char* reply, std::string_view body,
               const std::vector<std::pair<const char*, std::string>>& headers);
  bool may_answer(const char* reply) const;
  void add_endpoint(std::string name, std::string subject, std::string aid, json metadata, bool lists = false);
  void subscribe(const std::string& subject, Endpoint* ep);
  void answer_unknown(natsMsg* msg);

  Host& host_;
  const NatsFrontOptions& o_;
  const FrontControl& control_;
  NatsEventLoop loop_;  // the connection's socket (before nc_: it outlives the connection)
  natsConnection* nc_ = nullptr;
  ServiceInfo info_{o_.prefix, o_.queue_group};                // its id, its endpoints
  std::unordered_map<std::string, Endpoint*> tools_subjects_;  // endpoints under `tools.`, by subject
  std::vector<std::unique_ptr<Subscription>> subs_;
  std::vector<std::unique_ptr<Subscription>> discovery_;

  std::mutex mu_;
  std::condition_variable work_ready_, room_, idle_;
  std::deque<std::unique_ptr<Call>> queue_;
  std::size_t busy_ = 0;  // calls taken from the queue and not yet answered
  bool stopping_ = false;
  std::size_t workers_ = 0;                        // worker threads, those left inside a tool not counted
  bool dispatch_waits_ = false;                    // the subscriptions hold more than the queue had room for
  std::atomic<bool> dispatching_{false};           // the subscriptions are all made
  std::size_t dispatch_from_ = 0;                  // event loop thread: the subscription read first
  std::vector<std::unique_ptr<Call>> dispatched_;  // event loop thread: a batch for the queue
  Endpoint* durable_ep_ = nullptr;
  std::unique_ptr<DurableConsumer> durable_;  // --nats-durable
  std::shared_ptr<NatsKvStore> store_;        // --nats-idempotency kv: the host's idempotency store
};

void Call::deliver(Response response) {
  std::string line;
  encode_response(response, line);
  server->add_worker(/*replacing=*/true);  // this call's thread stays in the tool: another takes its place
  server->finish(*this, line);
  server->released_by_takeover();
  delivered = true;
  delivered.notify_all();
}

NatsServer::~NatsServer() {
  // After a failed start, deliveries and workers may still be under way: they end first.
  if (durable_) durable_->stop_fetching();
  if (nc_ != nullptr) natsConnection_Close(nc_);
  loop_.stop();  // (no dispatch from here on)
  {
    std::unique_lock lock(mu_);
    stopping_ = true;
    work_ready_.notify_all();
    room_.notify_all();
    idle_.wait(lock, [&] { return queue_.empty() && busy_ == 0 && workers_ == 0; });
  }
  durable_.reset();                                  // (every receipt is gone with its call)
  if (store_) host_.set_idempotency_store(nullptr);  // (before the connection it uses goes)
  store_.reset();
  for (auto& s : subs_) natsSubscription_Destroy(s->sub);
  for (auto& s : discovery_) natsSubscription_Destroy(s->sub);
  if (nc_ != nullptr) natsConnection_Destroy(nc_);
}

bool NatsServer::may_answer(const char* reply) const {
  if (reply == nullptr || reply[0] != '$') return true;
  // Under '$' lie JetStream's API, the key-value store and the system's subjects: the host's
  // own permissions must not let a requester write there through it.
  say("not answered: the reply subject '" + header_text(reply, 100) + "' lies under '$'");
  return false;
}

void NatsServer::publish(const char* reply, std::string_view body,
                         const std::vector<std::pair<const char*, std::string>>& headers) {
  if (reply == nullptr || *reply == '\0') return;
  if (headers.empty()) {
    (void)natsConnection_Publish(nc_, reply, body.data(), static_cast<int>(body.size()));
    return;
  }
  natsMsg* out = nullptr;
  if (natsMsg_Create(&out, reply, nullptr, body.data(), static_cast<int>(body.size())) != NATS_OK) return;
  for (const auto& [key, value] : headers) natsMsgHeader_Set(out, key, value.c_str());
  (void)natsConnection_PublishMsg(nc_, out);  // (a requester gone: nothing to tell)
  natsMsg_Destroy(out);
}

void NatsServer::finish(Call& call, std::string_view line) {
  while (!line.empty() && line.back() == '\n') line.remove_suffix(1);
  const char* reply = natsMsg_GetReply(call.msg);
  if (call.ep->lists_tools) {
    call.ep->record(Clock::now() - call.start, nullptr);
    publish(reply, line, {});
    return;
  }
  if (call.asks.form == Form::envelope && call.receipt == nullptr && line.starts_with("{\"ok\":true,")) {
    call.ep->record(Clock::now() - call.start, nullptr);  // the host's line is the answer
    publish(reply, line, {});
    return;
  }
  FormAnswer a = answer_in_form(call.asks, line);
  call.ep->record(Clock::now() - call.start, a.ok ? nullptr : &a.error);
  if (call.receipt) a.headers.emplace_back(kHdrRequestId, call.receipt->request_id());
  publish(reply, a.body, a.headers);
  if (call.receipt) call.receipt->acknowledge();
}

void NatsServer::answer(Call& call, std::string_view line) {
  NatsEventLoop::Held held(loop_);
  finish(call, line);
  bool last = false;
  {
    std::lock_guard lock(mu_);
    last = --busy_ == 0 && queue_.empty();
    idle_.notify_all();
  }
  if (last && call.from != nullptr) {
    int pending = 0;  // more calls have come for the workers: this reply goes out with theirs
    last = natsSubscription_GetPending(call.from, &pending, nullptr) != NATS_OK || pending == 0;
  }
  // (Uncounted now, but the server still waits for this thread, which goes back to work().)
  held.settle(nc_, last);
}

bool NatsServer::serve_one(std::unique_ptr<Call> call) {
  std::string line;
  if (call->ep->lists_tools) {
    answer(*call, tool_list_json(host_));
  } else {
    natsMsg* msg = call->msg;
    const std::string_view data(natsMsg_GetData(msg), static_cast<std::size_t>(natsMsg_GetDataLength(msg)));
    const auto header = [msg](const char* name) -> const char* {
      const char* value = nullptr;
      return natsMsgHeader_Get(msg, name, &value) == NATS_OK ? value : nullptr;
    };
    if (read_message(host_.registry(), call->ep->subject, call->ep->aid, data, header, call->asks, line)) {
      const MessageCall& asks = call->asks;
      CallerState session(/*respond_with_delta=*/true);  // calls over NATS carry their own state
      const auto handled = ndjson::respond(host_, asks.request, session, line, kNatsFront, call.get(), asks.run_aid,
                                           /*nul_terminated=*/true);
      if (handled.overran) {
        call->delivered.wait(false);
        return false;
      }
    }
    answer(*call, line);
  }
  return true;
}

void NatsServer::released_by_takeover() {
  std::lock_guard lock(mu_);
  --busy_;
  idle_.notify_all();
}

void NatsServer::work() {
  for (;;) {
    std::unique_ptr<Call> call;
    bool poke = false;
    {
      std::unique_lock lock(mu_);
      work_ready_.wait(lock, [&] { return !queue_.empty() || stopping_; });
      if (queue_.empty()) {
        --workers_;
        idle_.notify_all();
        return;
      }
      call = std::move(queue_.front());
      queue_.pop_front();
      ++busy_;
      room_.notify_one();
      poke = dispatch_waits_ && queue_.size() <= o_.workers / 2;
      if (poke) dispatch_waits_ = false;
    }
    if (poke) loop_.poke();
    if (!serve_one(std::move(call))) return;  // (a replacement has taken its place and its count)
  }
}

void NatsServer::add_worker(bool replacing) {
  if (!replacing) {
    std::lock_guard lock(mu_);
    ++workers_;
  }
  std::thread([this] { work(); }).detach();
}

void NatsServer::serve_durable(natsMsg* call, std::unique_ptr<DurableReceipt> receipt) {
  take(durable_ep_, call, std::move(receipt));
}

std::size_t NatsServer::idle_workers(std::chrono::milliseconds wait) {
  std::unique_lock lock(mu_);
  const auto idle = [&] { return workers_ > busy_ + queue_.size() ? workers_ - busy_ - queue_.size() : 0; };
  idle_.wait_for(lock, wait, [&] { return idle() > 0 || stopping_; });
  return idle();
}

std::unique_ptr<Call> NatsServer::make_call(Endpoint* ep, natsMsg* msg) {
  if (!may_answer(natsMsg_GetReply(msg))) {
    natsMsg_Destroy(msg);  // (not run: its answer could go nowhere)
    return nullptr;
  }
  auto call = std::make_unique<Call>();
  call->server = this;
  call->ep = ep;
  call->msg = msg;
  call->start = Clock::now();
  return call;
}

void NatsServer::take(Endpoint* ep, natsMsg* msg, std::unique_ptr<DurableReceipt> receipt) {
  auto call = make_call(ep, msg);
  if (call == nullptr) return;
  call->receipt = std::move(receipt);
  std::unique_lock lock(mu_);
  // A full queue holds this delivery (the durable consumer's fetches).
  room_.wait(lock, [&] { return queue_.size() < o_.workers || stopping_; });
  queue_.push_back(std::move(call));
  work_ready_.notify_one();
}

void NatsServer::answer_unknown(natsMsg* msg) {
  const char* reply = natsMsg_GetReply(msg);
  if (may_answer(reply)) {
    const std::string error =
        "InvalidInput: no tool is served on the subject " + header_text(natsMsg_GetSubject(msg), 200);
    publish(reply, json{{"data", nullptr}, {"error", error}}.dump(),
            {{kHdrError, error}, {kHdrErrorCode, "400"}, {kHdrWireCode, "malformed_request"}});
  }
  natsMsg_Destroy(msg);
}

std::unique_ptr<Call> NatsServer::route(const Subscription& s, natsMsg* msg) {
  Endpoint* ep = s.ep;
  if (ep == nullptr) {
    const auto it = tools_subjects_.find(natsMsg_GetSubject(msg));
    if (it == tools_subjects_.end()) {
      answer_unknown(msg);
      return nullptr;
    }
    ep = it->second;
  }
  auto call = make_call(ep, msg);
  if (call != nullptr) call->from = s.sub;
  return call;
}

void NatsServer::dispatch() {
  if (!dispatching_.load()) return;
  std::size_t room = 0;
  {
    std::lock_guard lock(mu_);
    room = queue_.size() < o_.workers ? o_.workers - queue_.size() : 0;
    if (room == 0) {
      dispatch_waits_ = true;
      return;
    }
  }
  // A full queue leaves the messages in the client, up to each subscription's pending limit,
  // beyond which they are dropped (never an unbounded buffer). Each pass starts at the next
  // subscription, so that a busy one does not starve the others.
  bool more = false;
  dispatch_from_ = (dispatch_from_ + 1) % subs_.size();
  for (std::size_t i = 0; i < subs_.size() && !more; ++i) {
    const Subscription& s = *subs_[(dispatch_from_ + i) % subs_.size()];
    for (;;) {
      int pending = 0;
      if (natsSubscription_GetPending(s.sub, &pending, nullptr) != NATS_OK || pending <= 0) break;
      if (dispatched_.size() == room) {
        more = true;
        break;
      }
      natsMsg* msg = nullptr;
      const natsStatus st = natsSubscription_NextMsg(&msg, s.sub, 0);
      if (st == NATS_SLOW_CONSUMER) continue;  // (on_error has said so; the messages kept follow)
      if (st != NATS_OK) break;
      if (auto call = route(s, msg)) dispatched_.push_back(std::move(call));
    }
  }
  std::lock_guard lock(mu_);
  dispatch_waits_ = dispatch_waits_ || more;
  for (auto& call : dispatched_) {
    queue_.push_back(std::move(call));
    work_ready_.notify_one();
  }
  dispatched_.clear();
}

void NatsServer::finish_drain() {
  const auto until = Clock::now() + std::chrono::seconds(5);
  for (auto& s : subs_) {
    for (;;) {
      const natsStatus done = natsSubscription_WaitForDrainCompletion(s->sub, 1);
      if (done != NATS_TIMEOUT || Clock::now() > until) break;
      natsMsg* msg = nullptr;  // (read empty while draining, the subscription completes its drain)
      if (natsSubscription_NextMsg(&msg, s->sub, 10) != NATS_OK) continue;
      auto call = route(*s, msg);
      if (call == nullptr) continue;
      std::unique_lock lock(mu_);
      room_.wait(lock, [&] { return queue_.size() < o_.workers || stopping_; });
      queue_.push_back(std::move(call));
      work_ready_.notify_one();
    }
  }
}

void NatsServer::on_discovery(natsConnection*, natsSubscription*, natsMsg* msg, void* closure) {
  auto* s = static_cast<Subscription*>(closure);
  NatsServer& self = *s->server;
  const std::string_view subject = natsMsg_GetSubject(msg);
  const char* reply = natsMsg_GetReply(msg);
  const json data =
      self.store_ ? json{{"idempotency_entries_rejected", self.store_->entries_rejected()}} : json(nullptr);
  const json body = self.info_.answer(subject, data);
  if (self.may_answer(reply)) self.publish(reply, body.dump(), {});
  natsMsg_Destroy(msg);
}

void NatsServer::on_error(natsConnection*, natsSubscription* sub, natsStatus s, void*) {
  if (s == NATS_SLOW_CONSUMER) {
    say("SlowConsumerError: messages dropped on " +
        std::string(sub ? natsSubscription_GetSubject(sub) : "a subscription") +
        " (more waiting than its pending limit)");
    return;
  }
  say(std::string("NATS error: ") + natsStatus_GetText(s));
}

void NatsServer::add_endpoint(std::string name, std::string subject, std::string aid, json metadata, bool lists) {
  for (const auto& e : info_.endpoints) {
    if (e->subject == subject) return;
  }
  auto ep = std::make_unique<Endpoint>();
  ep->name = std::move(name);
  ep->subject = std::move(subject);
  ep->aid = std::move(aid);
  ep->metadata = std::move(metadata);
  ep->lists_tools = lists;
  info_.endpoints.push_back(std::move(ep));
}

void NatsServer::subscribe(const std::string& subject, Endpoint* ep) {
  auto s = std::make_unique<Subscription>(Subscription{this, ep});
  natsStatus st = natsConnection_QueueSubscribeSync(&s->sub, nc_, subject.c_str(), o_.queue_group.c_str());
  if (st == NATS_OK) st = natsSubscription_SetPendingLimits(s->sub, o_.max_pending, 64 * 1024 * 1024);
  if (st != NATS_OK) throw ConfigError("--nats: cannot subscribe to " + subject + ": " + natsStatus_GetText(st));
  subs_.push_back(std::move(s));
}

int NatsServer::run() {
  // The endpoints: the call and list subjects, one per tool, and the `tools.*` names.
  const std::string& p = o_.prefix;
  add_endpoint("call", p + ".call", "", json::object());
  add_endpoint("tools", p + ".tools", "", {{"lists", "tools"}}, true);
  for (const Tool* t : host_.registry().tools()) {
    const std::string& aid = t->info.aid;
    if (!subject_safe(aid)) continue;
    if (t->info.alias_of.empty()) add_endpoint(endpoint_name(aid), p + ".tool." + aid, aid, {{"aid", aid}});
    if (aid.starts_with("tools.")) add_endpoint(endpoint_name(aid), aid, aid, {{"aid", aid}});
  }

  // No spinning on the client's locks: on a few cores a spinning thread takes the CPU the
  // lock's holder needs. (Only the first call sets it; a client already open keeps its own.)
  (void)nats_Open(0);
  natsOptions* opts = nullptr;
  natsStatus st = natsOptions_Create(&opts);
  const std::string client_name = std::string(kServiceName) + "-" + std::to_string(::getpid());
  if (st == NATS_OK) st = natsOptions_SetURL(opts, o_.url.c_str());
  if (st == NATS_OK) st = natsOptions_SetName(opts, client_name.c_str());
  if (st == NATS_OK) st = natsOptions_SetTimeout(opts, kConnectTimeoutMs);
  if (st == NATS_OK) st = natsOptions_SetMaxReconnect(opts, -1);  // once connected, reconnect for ever
  if (st == NATS_OK) st = natsOptions_SetReconnectWait(opts, 500);
  if (st == NATS_OK) st = natsOptions_SetSendAsap(opts, true);  // (written when the event loop says)
  if (st == NATS_OK) st = loop_.attach_to(opts, [this] { dispatch(); });
  if (st == NATS_OK) st = natsOptions_SetErrorHandler(opts, on_error, nullptr);
  if (st == NATS_OK) st = natsConnection_Connect(&nc_, opts);
  natsOptions_Destroy(opts);
  if (st != NATS_OK) {
    throw ConfigError("--nats: cannot connect to " + without_credentials(o_.url) + ": " + natsStatus_GetText(st) +
                      (st == NATS_NO_SERVER
                           ? std::string(" (is a NATS server running there? `nats-server -js -a 127.0.0.1` "
                                         "starts one; pip install 'machina-toolhost[nats]' brings it)")
                           : std::string()));
  }
  if (o_.shared_store) {
    store_ = std::make_shared<NatsKvStore>(
        nc_, NatsKvStoreOptions{o_.kv_bucket, o_.kv_key, o_.kv_ttl_s, o_.claim_grace_ms}, info_.id, say);
    host_.set_idempotency_store(store_);
  }

  const int stop_fd = stop_fd_of(control_);

  // Subjects under `tools.` all arrive through one wildcard subscription, so that an unknown
  // one is answered too, and a known one once (not by a second, exact subscription).
  for (const auto& ep : info_.endpoints) {
    if (ep->subject.starts_with("tools."))
      tools_subjects_[ep->subject] = ep.get();
    else
      subscribe(ep->subject, ep.get());
  }
  subscribe(kToolsWildcard, nullptr);
  if (o_.durable) {  // an endpoint for its statistics, fed by the stream
    add_endpoint("durable", durable_subject(p), "", {{"stream", o_.stream}, {"consumer", o_.consumer}});
    durable_ep_ = info_.endpoints.back().get();
  }
  for (const char* verb : {"PING", "INFO", "STATS"}) {
    const std::string base = std::string("$SRV.") + verb;
    for (const std::string& subject : {base, base + "." + kServiceName, base + "." + kServiceName + "." + info_.id}) {
      auto s = std::make_unique<Subscription>(Subscription{this, nullptr});
      st = natsConnection_Subscribe(&s->sub, nc_, subject.c_str(), on_discovery, s.get());
      if (st != NATS_OK) throw ConfigError("--nats: cannot subscribe to " + subject + ": " + natsStatus_GetText(st));
      discovery_.push_back(std::move(s));
    }
  }
  for (unsigned i = 0; i < o_.workers; ++i) add_worker();
  dispatching_ = true;
  loop_.poke();
  if (o_.durable) {
    durable_ = std::make_unique<DurableConsumer>(nc_, o_, *this);
    durable_->start();
  }
  st = natsConnection_FlushTimeout(nc_, kFlushTimeoutMs);
  if (st != NATS_OK) {
    throw ConfigError("--nats: " + without_credentials(o_.url) +
                      " did not confirm the subscriptions: " + natsStatus_GetText(st));
  }
  say("serving " + std::to_string(info_.endpoints.size()) + " endpoints as " + kServiceName + " " + info_.id + " on " +
      without_credentials(o_.url));
  if (control_.on_serving) control_.on_serving(without_credentials(o_.url));

  for (;;) {
    pollfd pfd{stop_fd, POLLIN, 0};
    if (::poll(&pfd, 1, -1) > 0) break;
  }
  // Stop taking calls: the server forgets the subscriptions, and what the client holds of
  // them is still delivered and queued.
  if (durable_) durable_->stop_fetching();
  for (auto& s : subs_) natsSubscription_Drain(s->sub);
  for (auto& s : discovery_) natsSubscription_Unsubscribe(s->sub);
  finish_drain();
  {
    // Every call taken is answered (a call left inside a tool was answered at its deadline).
    std::unique_lock lock(mu_);
    stopping_ = true;
    work_ready_.notify_all();
    room_.notify_all();
    idle_.wait(lock, [&] { return queue_.empty() && busy_ == 0 && workers_ == 0; });
  }
  natsConnection_FlushTimeout(nc_, kFlushTimeoutMs);
  return 0;
}

}  // namespace

void check_nats_front_options(const NatsFrontOptions& options) {
  if (!subject_safe(options.prefix))
    throw ConfigError("--nats-prefix " + options.prefix +
                      ": expected subject tokens (letters, digits, _ and -) joined by dots");
  if (!subject_safe(options.queue_group) || options.queue_group.find('.') != std::string::npos)
    throw ConfigError("--nats-queue-group " + options.queue_group + ": expected one token (letters, digits, _ and -)");
  if (!subject_safe(options.stream) || options.stream.find('.') != std::string::npos)
    throw ConfigError("--nats-stream " + options.stream + ": expected one token (letters, digits, _ and -)");
  if (!subject_safe(options.consumer) || options.consumer.find('.') != std::string::npos)
    throw ConfigError("--nats-consumer " + options.consumer + ": expected one token (letters, digits, _ and -)");
  if (!(options.ack_wait_s > 0) || options.max_deliver < 1)
    throw ConfigError("--nats-ack-wait-s and --nats-max-deliver must be positive");
  if (!subject_safe(options.kv_bucket) || options.kv_bucket.find('.') != std::string::npos)
    throw ConfigError("--nats-kv-bucket " + options.kv_bucket + ": expected one token (letters, digits, _ and -)");
}

int serve_nats(Host& host, const NatsFrontOptions& options, const FrontControl& control) {
  check_nats_front_options(options);
  NatsServer server(host, options, control);
  return server.run();
}

}  // namespace machina::cli
