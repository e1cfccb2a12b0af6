// See nats_durable.hpp.
#include "nats_durable.hpp"

#include "nats_message_forms.hpp"
#include "say.hpp"

#include <machina/errors.hpp>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string_view>

namespace machina::cli {
namespace {

using json = nlohmann::json;

constexpr char kHdrReplyTo[] = "Machina-Reply-To";
constexpr char kHdrMsgId[] = "Nats-Msg-Id";
// The headers a call carries into the host, as on the other subjects.
constexpr const char* kCallHeaders[] = {"Machina-User", "Machina-Lease", "Machina-Timeout-Ms"};
constexpr std::int64_t kStreamMaxMsgs = 100'000;
constexpr std::int64_t kStreamMaxBytes = 256LL * 1024 * 1024;
constexpr std::int64_t kDuplicateWindowNs = 120'000'000'000LL;  // a re-published call is dropped
constexpr int kFetchBatch = 64;                                 // messages asked for at once (at most the idle workers)
constexpr std::int64_t kFetchTimeoutMs = 500;                   // also how long stopping waits for a fetch
constexpr auto kRetryWait = std::chrono::milliseconds(250);
constexpr auto kIdleWait = std::chrono::milliseconds(100);  // (then whether to stop is looked at again)
constexpr auto kMinProgressPeriod = std::chrono::milliseconds(50);
constexpr unsigned kMaxAckPendingPerWorker = 4;    // unacknowledged messages per consumer, per host worker
constexpr std::size_t kMaxAnsweredKept = 100'000;  // messages remembered as answered (the stream's cap)

std::string header(natsMsg* msg, const char* name) {
  const char* value = nullptr;
  return natsMsgHeader_Get(msg, name, &value) == NATS_OK && value != nullptr ? std::string(value) : std::string();
}

/// Whether an answer can be published to `subject`: tokens of visible characters other than
/// the wildcards, joined by single dots.
bool publishable(std::string_view subject) {
  if (subject.empty() || subject.front() == '.' || subject.back() == '.') return false;
  char prev = 'x';
  for (const char c : subject) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= ' ' || u == 0x7f || c == '*' || c == '>' || (c == '.' && prev == '.')) return false;
    prev = c;
  }
  return true;
}

StoredMessage stored_message(natsMsg* msg) {
  jsMsgMetaData* meta = nullptr;
  if (natsMsg_GetMetaData(&meta, msg) != NATS_OK) return {};
  const StoredMessage stored{meta->Sequence.Stream, meta->Timestamp};
  jsMsgMetaData_Destroy(meta);
  return stored;
}

std::string failure(natsStatus st, jsErrCode err) {
  std::string text = natsStatus_GetText(st);
  if (const char* last = nats_GetLastError(nullptr); last != nullptr && *last != '\0' && text != last)
    text += std::string(" (") + last + ")";
  if (err != 0) text += " [JetStream error " + std::to_string(static_cast<int>(err)) + "]";
  return text;
}

/// The call a stream message asks for, as the front serves it: its body with the idempotency
/// key added when it names none (its own Idempotency-Key header, else the message id), its
/// answer addressed to its Machina-Reply-To subject. nullptr if it cannot be made.
natsMsg* call_of(natsMsg* msg, const std::string& subject, const std::string& reply, const std::string& msg_id) {
  std::string key = header(msg, kHdrIdempotencyKey);
  if (key.empty() && !msg_id.empty()) key = "msg:" + msg_id;  // a redelivery never runs twice
  std::string_view data(natsMsg_GetData(msg), static_cast<std::size_t>(natsMsg_GetDataLength(msg)));
  std::string rewritten;
  if (!key.empty()) {
    json body = json::parse(data, nullptr, false);
    const bool openai = body.is_object() && body.contains("function") && body["function"].is_object();
    if (body.is_object() && !openai) {
      const auto it = body.find("idempotency_key");
      if (it == body.end() || it->is_null() || (it->is_string() && it->get_ref<const std::string&>().empty())) {
        body["idempotency_key"] = key;
        rewritten = body.dump();
        data = rewritten;
      }
    }
  }
  natsMsg* call = nullptr;
  if (natsMsg_Create(&call, subject.c_str(), reply.empty() ? nullptr : reply.c_str(), data.data(),
                     static_cast<int>(data.size())) != NATS_OK)
    return nullptr;
  for (const char* name : kCallHeaders) {
    if (const std::string value = header(msg, name); !value.empty()) natsMsgHeader_Set(call, name, value.c_str());
  }
  if (!key.empty()) natsMsgHeader_Set(call, kHdrIdempotencyKey, key.c_str());
  return call;
}

}  // namespace

std::string durable_subject(const std::string& prefix) {
  return prefix + ".durable.call";
}

DurableReceipt::DurableReceipt(DurableConsumer& consumer, natsMsg* msg)
    : consumer_(&consumer), msg_(msg), stored_(stored_message(msg)), request_id_(header(msg, kHdrMsgId)) {
  consumer.hold(msg, stored_);
}

DurableReceipt::~DurableReceipt() {
  if (consumer_ != nullptr) consumer_->release(msg_, /*answered=*/false);
  natsMsg_Destroy(msg_);
}

void DurableReceipt::acknowledge() {
  if (consumer_ == nullptr) return;
  // Out of the messages kept in progress first: nothing else touches it from here.
  if (consumer_->release(msg_, /*answered=*/true)) (void)natsMsg_Ack(msg_, nullptr);  // (lost: delivered again)
  consumer_ = nullptr;
}

DurableConsumer::DurableConsumer(natsConnection* nc, const NatsFrontOptions& options, DurableSink& sink)
    : nc_(nc), o_(options), sink_(sink), subject_(durable_subject(options.prefix)) {}

DurableConsumer::~DurableConsumer() {
  stop_fetching();
  {
    std::lock_guard lock(mu_);
    stop_ticking_ = true;
    changed_.notify_all();
  }
  if (ticker_.joinable()) ticker_.join();
  // Destroyed, not unsubscribed: the consumer belongs to the group and stays on the server.
  if (sub_ != nullptr) natsSubscription_Destroy(sub_);
  if (js_ != nullptr) jsCtx_Destroy(js_);
}

void DurableConsumer::ensure_stream_and_consumer() {
  jsStreamConfig sc;
  jsStreamConfig_Init(&sc);
  const char* subjects[] = {subject_.c_str()};
  sc.Name = o_.stream.c_str();
  sc.Subjects = subjects;
  sc.SubjectsLen = 1;
  sc.Retention = js_WorkQueuePolicy;
  sc.MaxMsgs = kStreamMaxMsgs;
  sc.MaxBytes = kStreamMaxBytes;
  sc.Discard = js_DiscardNew;  // a full stream refuses a new call rather than drop a waiting one
  sc.Duplicates = kDuplicateWindowNs;
  jsErrCode err = static_cast<jsErrCode>(0);
  natsStatus st = js_AddStream(nullptr, js_, &sc, nullptr, &err);
  if (st != NATS_OK && st != NATS_NO_RESPONDERS && st != NATS_TIMEOUT) {
    err = static_cast<jsErrCode>(0);
    st = js_UpdateStream(nullptr, js_, &sc, nullptr, &err);  // there already, made otherwise
  }
  if (st == NATS_NO_RESPONDERS)
    throw ConfigError("--nats-durable: the server at " + o_.url + " has no JetStream (nats-server -js)");
  if (st != NATS_OK) throw ConfigError("--nats-durable: cannot make the stream " + o_.stream + ": " + failure(st, err));

  jsConsumerConfig cc;
  jsConsumerConfig_Init(&cc);
  cc.Durable = o_.consumer.c_str();
  cc.AckPolicy = js_AckExplicit;
  cc.AckWait = static_cast<std::int64_t>(o_.ack_wait_s * 1e9);
  cc.MaxDeliver = o_.max_deliver;
  cc.MaxAckPending = static_cast<std::int64_t>(o_.workers) * kMaxAckPendingPerWorker;
  cc.FilterSubject = subject_.c_str();
  err = static_cast<jsErrCode>(0);
  st = js_AddConsumer(nullptr, js_, o_.stream.c_str(), &cc, nullptr, &err);
  if (st != NATS_OK) {
    err = static_cast<jsErrCode>(0);
    st = js_UpdateConsumer(nullptr, js_, o_.stream.c_str(), &cc, nullptr, &err);
  }
  if (st != NATS_OK)
    throw ConfigError("--nats-durable: cannot make the consumer " + o_.consumer + ": " + failure(st, err));
}

void DurableConsumer::start() {
  natsStatus st = natsConnection_JetStream(&js_, nc_, nullptr);
  if (st != NATS_OK) throw ConfigError(std::string("--nats-durable: ") + natsStatus_GetText(st));
  ensure_stream_and_consumer();
  jsSubOptions so;
  jsSubOptions_Init(&so);
  so.Stream = o_.stream.c_str();
  so.Consumer = o_.consumer.c_str();  // bound to the group's consumer, never made or deleted by this subscription
  jsErrCode err = static_cast<jsErrCode>(0);
  st = js_PullSubscribe(&sub_, js_, subject_.c_str(), o_.consumer.c_str(), nullptr, &so, &err);
  if (st != NATS_OK) throw ConfigError("--nats-durable: cannot pull from " + o_.consumer + ": " + failure(st, err));
  ticker_ = std::thread([this] { keep_in_progress(); });
  fetcher_ = std::thread([this] { fetch_loop(); });
}

void DurableConsumer::stop_fetching() {
  {
    std::lock_guard lock(mu_);
    stop_fetching_ = true;
    changed_.notify_all();
  }
  if (fetcher_.joinable()) fetcher_.join();
}

void DurableConsumer::hold(natsMsg* msg, StoredMessage stored) {
  std::lock_guard lock(mu_);
  held_.emplace(msg, stored);
}

bool DurableConsumer::release(natsMsg* msg, bool answered) {
  std::lock_guard lock(mu_);
  const auto it = held_.find(msg);
  if (it == held_.end()) return false;
  if (answered && it->second.known() && answered_.insert(it->second).second) {
    const auto now = std::chrono::steady_clock::now();
    answered_order_.emplace_back(now, it->second);
    // Kept while the server may deliver it again: the ack wait, once per delivery left.
    const auto horizon = std::chrono::duration<double>(o_.ack_wait_s * (o_.max_deliver + 1));
    while (!answered_order_.empty() &&
           (answered_order_.size() > kMaxAnsweredKept || now - answered_order_.front().first > horizon)) {
      answered_.erase(answered_order_.front().second);
      answered_order_.pop_front();
    }
  }
  held_.erase(it);
  changed_.notify_all();
  return true;
}

void DurableConsumer::dispatch(natsMsg* msg) {
  // A delivery of a message this host has answered (its ack lost, say, to a server restart)
  // is acknowledged again and not answered twice; one it is answering is left to that call.
  if (const StoredMessage stored = stored_message(msg); stored.known()) {
    bool answered = false, running = false;
    {
      std::lock_guard lock(mu_);
      answered = answered_.contains(stored);
      for (const auto& [_, held] : held_) running = running || held == stored;
    }
    if (answered) (void)natsMsg_Ack(msg, nullptr);
    if (answered || running) {
      natsMsg_Destroy(msg);
      return;
    }
  }
  auto receipt = std::make_unique<DurableReceipt>(*this, msg);
  const std::string reply = header(msg, kHdrReplyTo);
  // Not run, and not delivered again, when its answer could go nowhere: under '$' lie
  // JetStream's API, the key-value store and the system's subjects; and a reply that is no
  // subject would break the connection's protocol.
  const char* refused = reply.empty()          ? nullptr
                        : reply.front() == '$' ? "lies under '$'"
                        : !publishable(reply)  ? "is not a subject"
                                               : nullptr;
  if (refused != nullptr) {
    std::string shown = reply.substr(0, 100);
    for (char& c : shown) {
      if (static_cast<unsigned char>(c) < ' ' || c == 0x7f) c = ' ';
    }
    say("not answered: the reply subject '" + shown + "' " + refused);
    receipt->acknowledge();
    return;
  }
  natsMsg* call = call_of(msg, subject_, reply, receipt->request_id());
  if (call == nullptr) return;  // (released: delivered again after the ack wait)
  sink_.serve_durable(call, std::move(receipt));
}

void DurableConsumer::fetch_loop() {
  bool failing = false;
  for (;;) {
    std::size_t room = 0;
    {
      // At most --workers messages held at once ...
      std::unique_lock lock(mu_);
      changed_.wait(lock, [&] { return stop_fetching_ || held_.size() < o_.workers; });
      if (stop_fetching_) return;
      room = o_.workers - held_.size();
    }
    // ... and only as many as the host has workers idle: the others stay for idle hosts.
    const std::size_t idle = sink_.idle_workers(kIdleWait);
    if (idle == 0) continue;
    const int batch = static_cast<int>(std::min({static_cast<std::size_t>(kFetchBatch), room, idle}));
    natsMsgList list{};
    jsErrCode err = static_cast<jsErrCode>(0);
    const natsStatus st = natsSubscription_Fetch(&list, sub_, batch, kFetchTimeoutMs, &err);
    for (int i = 0; i < list.Count; ++i) {
      natsMsg* msg = list.Msgs[i];
      list.Msgs[i] = nullptr;
      dispatch(msg);
    }
    natsMsgList_Destroy(&list);
    if (st == NATS_OK || st == NATS_TIMEOUT) {
      if (failing) say("--nats-durable: fetching from " + o_.consumer + " again");
      failing = false;
      continue;
    }
    // The server restarting, or the stream or consumer gone: once connected, both are made
    // again where missing, and fetching resumes.
    if (!failing) say("--nats-durable: cannot fetch from " + o_.consumer + ": " + failure(st, err) + "; retrying");
    failing = true;
    {
      std::unique_lock lock(mu_);
      if (changed_.wait_for(lock, kRetryWait, [&] { return stop_fetching_; })) return;
    }
    if (natsConnection_Status(nc_) == NATS_CONN_STATUS_CONNECTED) {
      try {
        ensure_stream_and_consumer();
      } catch (const ConfigError&) {
        // (said once above; tried again after the next failed fetch)
      }
    }
  }
}

void DurableConsumer::keep_in_progress() {
  const auto period = std::max<std::chrono::steady_clock::duration>(
      kMinProgressPeriod, std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(o_.ack_wait_s / 3)));
  std::unique_lock lock(mu_);
  for (;;) {
    const auto next = std::chrono::steady_clock::now() + period;
    if (changed_.wait_until(lock, next, [&] { return stop_ticking_; })) return;
    for (const auto& [msg, _] : held_) (void)natsMsg_InProgress(msg, nullptr);
  }
}

}  // namespace machina::cli
