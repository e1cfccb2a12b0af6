// The request pipeline; see host.hpp and docs/protocol.md for the order of the rules.
#include <machina/call_context.hpp>
#include <machina/host.hpp>
#include <machina/json_text.hpp>
#include <machina/nearest_name.hpp>

#include <algorithm>
#include <type_traits>

namespace machina {

/// What handle_checked knows that the rest of a call needs: the idempotency entry to
/// complete and the front's overrun sink. It is also the host's side of an inline call that
/// overruns its deadline (Overrun, called on the inline runner's watchdog thread):
/// `finished` then says the overrun path already completed the entry and counted the
/// failure, so the normal path must not do it again.
struct Host::InFlight final : Overrun {
  Host* host = nullptr;
  const Tool* tool = nullptr;
  const Request* request = nullptr;
  CallerState* session = nullptr;
  std::int64_t timeout_ms = 0;
  std::int64_t started_ns = 0;                       // when the host took the request (steady clock)
  std::int64_t returned_ms = 0;                      // when the runner returned (steady_now_ms_not_after), if it ran
  std::shared_ptr<const Slots> base;                 // the state the request set, if it sent one
  IdempotencyStore* store = nullptr;                 // where `ticket` is held
  const IdempotencyStore::Ticket* ticket = nullptr;  // set: complete it
  OverrunSink* overrun_sink = nullptr;
  bool finished = false;
  Response overrun_answer;    // the timeout response, when there is no overrun sink
  bool sent_to_sink = false;  // the overrun sink has answered the call

  void overrun() noexcept override;
};

Host::Host(HostOptions options, Hooks hooks)
    : options_(std::move(options)),
      hooks_(std::move(hooks)),
      idempotency_(options_.idempotency),
      registry_(options_.breaker) {
  options_.check();
  // Before any tool of this host can run (its plugins are not loaded yet). machina-toolhost
  // has already taken the variable out of its environment; an embedding program keeps it.
  protect_lease_secret(/*unset=*/false);
  if (options_.lease_enforce) leases_ = std::make_unique<LeaseAuthority>(load_lease_secret(), options_.lease);
  if (options_.audit.enabled()) {
    try {
      audit_ = std::make_unique<AuditLog>(options_.audit);
    } catch (const ConfigError& e) {
      if (!options_.audit.optional) throw;
      audit_unavailable_ = e.what();
      // Without the database; a JSON lines file named on purpose must still open.
      options_.audit.db_path.clear();
      if (options_.audit.enabled()) audit_ = std::make_unique<AuditLog>(options_.audit);
    }
  }
}

Host::~Host() = default;

HostStats Host::stats() const {
  HostStats s;
  s.calls = calls_.load();
  s.timeouts = timeouts_.load();
  s.crashes = crashes_.load();
  return s;
}
void Host::event(const std::string& line) const {
  if (options_.on_event) options_.on_event(line);
}

Response Host::request_too_large() const {
  return Response::failure(ErrorKind::request_too_large,
                           "request exceeds the " + std::to_string(options_.max_request_bytes) + "-byte cap");
}

Response Host::tool_not_found(std::string_view aid) const {
  Response r = Response::failure(ErrorKind::tool_not_found, "tool not found: " + excerpt(aid));
  std::vector<std::string_view> aids;
  const auto tools = registry_.tools();
  aids.reserve(tools.size());
  for (const Tool* t : tools) aids.push_back(t->info.aid);
  const std::string nearest = nearest_name(aid, aids);
  const std::string& list = options_.operator_commands.tool_list;
  const std::string tool_list = " tool list" + (list.empty() ? "" : " (" + list + ")") + " names every tool";
  r.hint = nearest.empty() ? "the" + tool_list : "did you mean " + nearest + "? The" + tool_list;
  return r;
}

DsReport Host::report(CallerState& session, std::shared_ptr<const SlotChanges> changes) const {
  if (session.respond_with_delta()) return {DsReport::Mode::delta, std::move(changes)};
  return {DsReport::Mode::full, session.as_changes()};
}

std::int64_t Host::timeout_for(const Tool& tool, const Request& request) const {
  std::int64_t t = options_.default_timeout_ms;
  if (request.timeout_ms) {
    t = *request.timeout_ms;
  } else if (auto it = options_.tool_timeouts_ms.find(tool.info.aid); it != options_.tool_timeouts_ms.end()) {
    t = it->second;
  } else if (tool.info.default_timeout_ms > 0) {
    t = tool.info.default_timeout_ms;
  }
  return std::min(t, options_.max_timeout_ms);
}

Response Host::timeout_response(const Tool& tool, std::int64_t timeout_ms, const std::string& detail) const {
  std::string message = "timeout: " + tool.info.aid + " did not finish within " + std::to_string(timeout_ms) + " ms";
  if (!detail.empty()) message += " (" + detail + ")";
  return Response::failure(ErrorKind::timeout, std::move(message));
}

Response Host::handle(Request& request, CallerState& session, OverrunSink* overrun_sink) {
  // One clock read serves the deadline and the audit record.
  const std::int64_t started_ns = steady_now_ns();
  // Built where it is returned: a Response is several strings and a state, too much to
  // move twice per call.
  Response r = [&]() -> Response {
    try {
      return handle_checked(request, session, overrun_sink, started_ns);
    } catch (const std::exception& e) {
      return Response::failure(ErrorKind::internal_error, std::string("internal error: ") + e.what());
    }
  }();
  // (A response marked `overran` was recorded when the overrun sink answered.)
  if (audit_ && !r.overran) record_or_withhold(request, session, r, started_ns);
  r.id_json = std::move(request.id_json);
  if (request.ds_state && request.ds_state->numbered) r.ds_state.numbered = true;  // answered as asked
  return r;
}

AuditCall Host::audit_call(const Request& request, const Response& response, std::int64_t started_ns) const {
  AuditCall call;
  call.front = request.front.name;
  call.kind = response.kind;
  call.idempotent_hit = response.idempotent_hit;
  call.started_ns = started_ns;
  call.ended_ticks = audit_->ticks();
  call.aid = request.aid;
  if (request.user)
    call.user = *request.user;
  else if (!request.caller.empty())
    call.user = request.caller;
  else
    call.os_user = request.front.local_caller;
  call.input_json = request.input_json;
  call.output_bytes = response.output_json.size();
  return call;
}

void Host::record_call(const Request& request, const Response& response, std::int64_t started_ns) const {
  audit_->record(audit_call(request, response, started_ns));
}

void Host::record_or_withhold(const Request& request, CallerState& session, Response& r,
                              std::int64_t started_ns) const {
  const Tool* tool = audit_->options().required == AuditRequired::none || r.kind == ErrorKind::audit_unavailable
                         ? nullptr
                         : registry_.find(request.aid);
  if (tool == nullptr || !audit_->must_record(tool->info.tier)) {
    record_call(request, r, started_ns);
    return;
  }
  // A call the store must record is answered once its record is written: if the write
  // fails, the answer is withheld (the tool may have run; the state it changed stays, as
  // the session's delta says).
  if (audit_->record_committed(audit_call(request, r, started_ns))) return;
  DsReport state = std::move(r.ds_state);
  r = Response::failure(ErrorKind::audit_unavailable,
                        "audit_unavailable: the audit store cannot record; the call of " + tool->info.aid +
                            " ended but its record could not be written, so its answer is withheld");
  r.ds_state = state.mode == DsReport::Mode::none ? report(session, nullptr) : std::move(state);
  record_call(request, r, started_ns);
}

namespace {

/// What a request weighs, whichever front built it: the size of the fields it carries.
std::size_t request_bytes(const Request& r) {
  std::size_t n = r.aid.size() + r.input_json.size() + r.id_json.size() +
                  (r.idempotency_key ? r.idempotency_key->size() : 0) + (r.lease_token ? r.lease_token->size() : 0) +
                  (r.trace_id ? r.trace_id->size() : 0) + (r.user ? r.user->size() : 0);
  if (r.ds_state) {
    for (const auto& slot : r.ds_state->changes.slots) {
      if (slot) n += slot->type.size() + slot->content_json.size() + slot->provenance.size();
    }
  }
  return n;
}

}  // namespace

Response Host::handle_checked(Request& request, CallerState& session, OverrunSink* overrun_sink,
                              std::int64_t started_ns) {
  // The rules on the request itself, applied here so that every front gets them (a front
  // that reads lines has refused an oversized line before decoding it).
  if (request_bytes(request) > options_.max_request_bytes) return request_too_large();
  if (request.aid.empty()) {
    return Response::failure(ErrorKind::malformed_request, "malformed request: field 'aid' must not be empty");
  }
  if (request.timeout_ms &&
      (*request.timeout_ms < 1 || static_cast<std::uint64_t>(*request.timeout_ms) > kMaxRequestTimeoutMs)) {
    return Response::failure(ErrorKind::malformed_request, std::string("malformed request: ") + kTimeoutRuleText);
  }
  if (request.idempotency_key && request.idempotency_key->size() > options_.idempotency.max_key_bytes) {
    return Response::failure(ErrorKind::malformed_request, "malformed request: idempotency_key is longer than " +
                                                               std::to_string(options_.idempotency.max_key_bytes) +
                                                               " bytes");
  }
  if (request.trace_id && (request.trace_id->empty() || request.trace_id->size() > kMaxTraceIdBytes)) {
    return Response::failure(ErrorKind::malformed_request, "malformed request: trace_id must be from 1 to " +
                                                               std::to_string(kMaxTraceIdBytes) + " bytes");
  }
  if (request.user && (request.user->empty() || request.user->size() > kMaxUserBytes)) {
    return Response::failure(ErrorKind::malformed_request,
                             "malformed request: user must be from 1 to " + std::to_string(kMaxUserBytes) + " bytes");
  }
  // The state a request carries is applied even if the call then fails, so the
  // session stays the mirror of what the caller sent.
  std::shared_ptr<const Slots> base;
  if (request.ds_state) base = session.apply(*request.ds_state);

  const Tool* tool = registry_.find(request.aid);
  if (tool == nullptr) [[unlikely]]
    return tool_not_found(request.aid);

  // A call the audit store must record is refused while it cannot (before a lease is used).
  if (audit_ && audit_->must_record(tool->info.tier) && !audit_->can_record()) [[unlikely]] {
    Response r = Response::failure(ErrorKind::audit_unavailable,
                                   "audit_unavailable: the audit store cannot record (its last write failed); " +
                                       tool->info.aid + " is not run until it can");
    r.ds_state = report(session, nullptr);
    return r;
  }

  if (leases_ && tool->info.tier > 0) {
    if (!request.lease_token) {
      Response r = Response::failure(ErrorKind::lease_required, "lease_required");
      r.lease_tier = tool->info.tier;
      r.lease_aid = tool->info.aid;
      const std::string& issue = options_.operator_commands.lease_issue;
      r.hint = "a tier-" + std::to_string(tool->info.tier) +
               " tool runs only with a single-use lease: the operator issues one" +
               (issue.empty() ? "" : " with `" + issue + " " + tool->info.aid + "`") +
               " (with the host's lease secret) and the request sends it as `_lease_token`";
      return r;
    }
    if (auto why = leases_->redeem(*request.lease_token, tool->info.aid, unix_now_ms())) {
      Response r = Response::failure(ErrorKind::lease_rejected, "lease_rejected");
      r.lease_reason = std::move(*why);
      return r;
    }
  }
  InFlight in_flight;
  in_flight.overrun_sink = overrun_sink;
  in_flight.base = std::move(base);
  in_flight.started_ns = started_ns;
  const std::int64_t now = started_ns / 1'000'000;
  return [&] {  // (one Response, built in the caller's return slot)
    Response r;
    if (!request.idempotency_key)
      execute(*tool, request, session, now, in_flight, r);
    else if (!shared_store_) [[likely]]
      run_keyed(idempotency_, *tool, request, session, now, in_flight, r);
    else
      run_keyed<IdempotencyStore>(*shared_store_, *tool, request, session, now, in_flight, r);
    return r;
  }();
}

template <class Store>
void Host::run_keyed(Store& store, const Tool& tool, const Request& request, CallerState& session, std::int64_t now,
                     InFlight& in_flight, Response& r) {
  // (a fresh key's path is kept short in code: see IdempotencyCache::begin)
  IdempotencyStore::Ticket ticket;
  if constexpr (std::is_same_v<Store, IdempotencyCache>) {
    ticket = store.begin(tool.info.aid, *request.idempotency_key, request.input_json, now, r);
  } else {
    ticket = store.begin(
        KeyedCall{tool.info.aid, *request.idempotency_key, request.input_json, now, timeout_for(tool, request)}, r);
  }
  if (ticket.outcome != IdempotencyStore::Outcome::run) [[unlikely]] {
    if (!answer_without_running(store, tool, session, ticket, r)) return;
  }
  in_flight.store = &store;
  in_flight.ticket = &ticket;
  try {
    execute(tool, request, session, now, in_flight, r);
  } catch (...) {
    // A duplicate waiting for this call gets an answer even if the call throws.
    if (!in_flight.finished) {
      store.complete(ticket, Response::failure(ErrorKind::internal_error, "internal error"), false, steady_now_ms());
    }
    throw;
  }
  if (!in_flight.finished) {
    std::int64_t now_ms;
    if constexpr (std::is_same_v<Store, IdempotencyCache>) {
      // (kept from when the call returned, if it ran)
      now_ms =
          in_flight.returned_ms > 0 ? not_before_from_not_after(in_flight.returned_ms) : steady_now_ms_not_before();
    } else {
      now_ms = steady_now_ms();
    }
    store.complete(ticket, r, IdempotencyStore::keeps(r), now_ms);
  }
}

bool Host::answer_without_running(IdempotencyStore& store, const Tool& tool, CallerState& session,
                                  IdempotencyStore::Ticket& ticket, Response& r) {
  if (ticket.outcome == IdempotencyStore::Outcome::wait) {
    ticket = store.wait(ticket, r);
    if (ticket.outcome == IdempotencyStore::Outcome::run) return true;
  }
  switch (ticket.outcome) {
    case IdempotencyStore::Outcome::conflict:
      r = Response::failure(ErrorKind::idempotency_conflict,
                            "idempotency_key was already used with a different input for " + tool.info.aid);
      return false;
    case IdempotencyStore::Outcome::full:
      r = Response::failure(ErrorKind::overloaded, "overloaded: all " +
                                                       std::to_string(idempotency_.options().max_entries) +
                                                       " idempotency entries are calls still running; new keys "
                                                       "are refused until one finishes");
      return false;
    case IdempotencyStore::Outcome::hit: r.idempotent_hit = true; [[fallthrough]];
    case IdempotencyStore::Outcome::answered:
      r.ds_state = report(session, nullptr);  // no state changed: an empty delta in serve mode
      return false;
    case IdempotencyStore::Outcome::wait:  // (wait() never answers `wait`)
    case IdempotencyStore::Outcome::run: break;
  }
  return false;
}

void Host::execute(const Tool& tool, const Request& request, CallerState& session, std::int64_t now,
                   InFlight& in_flight, Response& r) {
  // `r` is the caller's (fresh) return object: a Response is not moved or made twice per
  // call.
  auto refuse = [&](ErrorKind kind, std::string message) {
    r = Response::failure(kind, std::move(message));
    r.ds_state = report(session, nullptr);
  };
  if (!tool.breaker.allow(now)) {
    refuse(ErrorKind::breaker_open, "circuit breaker open for " + tool.info.aid + ": too many host-side failures");
    return;
  }
  std::string why;
  if (!request.input_json_valid && !validate_json(request.input_json, &why)) {
    refuse(ErrorKind::invalid_input, "input_json is not valid JSON: " + why);
    return;
  }
  if (const SchemaValidator* schema = tool.input_validator()) {
    const auto input = nlohmann::json::parse(request.input_json);
    if (auto err = schema->validate(input)) {
      refuse(ErrorKind::schema_violation,
             "input_json does not match the input schema of " + tool.info.aid + ": " + *err);
      return;
    }
  }

  // Deadlines are kept in whole milliseconds; the + 1 below makes every call get at
  // least its full timeout_ms, never a clock tick less.
  const std::int64_t timeout_ms = timeout_for(tool, request);
  CallContext call(options_.max_output_bytes, &session);
  call.base = in_flight.base;  // null: taken from the session on the tool's first read
  in_flight.host = this;
  in_flight.tool = &tool;
  in_flight.request = &request;
  in_flight.session = &session;
  in_flight.timeout_ms = timeout_ms;
  calls_.fetch_add(1, std::memory_order_relaxed);
  const std::int64_t deadline_ms = now + timeout_ms + 1;
  RunOutcome outcome = tool.runner->run(
      RunSpec{tool, request.input_json, deadline_ms, timeout_ms, call, &in_flight,
              request.trace_id ? std::string_view(*request.trace_id) : std::string_view(), request.cancel,
              request.progress, request.user ? std::string_view(*request.user) : std::string_view()});
  // A call that returns past its deadline is a timeout, whatever ran it and whether or not
  // its runner's timer could act in time (a watchdog thread kept off the CPU on a loaded
  // machine, a worker's answer read as its time ran out): whether a late call succeeds
  // does not depend on scheduling. The coarse clock may read up to a tick early: a call
  // on time is never taken for late. (The reading also dates an idempotency entry.)
  in_flight.returned_ms = steady_now_ms_not_after();
  if (outcome.ending == RunOutcome::Ending::ran && in_flight.returned_ms >= deadline_ms) [[unlikely]] {
    event(tool.info.aid + " returned after its deadline before it could be stopped; answered timeout");
    outcome.ending = RunOutcome::Ending::timed_out;
    outcome.detail = "it returned after its deadline; its result was discarded";
  }
  const int rc = outcome.rc;
  switch (outcome.ending) {
    case RunOutcome::Ending::ran: break;
    case RunOutcome::Ending::timed_out:
      timeouts_.fetch_add(1, std::memory_order_relaxed);
      r = timeout_response(tool, timeout_ms, outcome.detail);
      break;
    case RunOutcome::Ending::crashed:
      crashes_.fetch_add(1, std::memory_order_relaxed);
      r = Response::failure(ErrorKind::tool_crashed, "tool crashed: " + tool.info.aid + ": " + outcome.detail);
      event(r.error);
      break;
    case RunOutcome::Ending::overloaded: refuse(ErrorKind::overloaded, outcome.detail); return;
    case RunOutcome::Ending::closed: refuse(ErrorKind::internal_error, "internal error: the host is closed"); return;
    case RunOutcome::Ending::failed: r = Response::failure(outcome.failure, outcome.detail); break;
    case RunOutcome::Ending::cancelled:
      r = Response::failure(ErrorKind::cancelled, "cancelled: " + tool.info.aid +
                                                      (outcome.detail.empty() ? "" : " (" + outcome.detail + ")"));
      break;
    case RunOutcome::Ending::overran:
      // The deadline won: the call was answered `timeout` (through the overrun sink, or kept
      // for this late return); what the tool did is discarded.
      if (in_flight.sent_to_sink) {
        r.overran = true;
      } else {
        r = std::move(in_flight.overrun_answer);
      }
      return;
  }

  if (r.ok()) {
    if (call.output_overflow) {
      r = Response::failure(ErrorKind::output_too_large,
                            "tool output exceeds the " + std::to_string(options_.max_output_bytes) + "-byte cap");
    } else if (rc == MACHINA_TOOL_OK) {
      if (!call.output_set) {
        r = Response::failure(ErrorKind::invalid_output, "tool reported success without an output");
      } else if (call.output != request.input_json && !validate_json(call.output, &why)) {
        // (Output identical to the input, which was just validated, needs no second pass.)
        r = Response::failure(ErrorKind::invalid_output, "tool output is not valid JSON: " + why);
      } else {
        r.output_json = std::move(call.output);
      }
    } else if (rc == MACHINA_TOOL_ERROR) {
      r = Response::failure(ErrorKind::tool_error, call.error.empty() ? "tool failed without a message" : call.error);
    } else if (rc == MACHINA_TOOL_FAULT) {
      r = Response::failure(ErrorKind::tool_fault,
                            "tool fault: " + (call.error.empty() ? std::string("no message") : call.error));
    } else {
      r = Response::failure(ErrorKind::tool_fault, "tool fault: unknown result code " + std::to_string(rc));
    }
  }

  // The clock is read only when needed.
  if (error_info(r.kind).counts_for_breaker)
    tool.breaker.record_failure(steady_now_ms());
  else if (tool.breaker.engaged())
    tool.breaker.record_success(steady_now_ms());

  // A failed call changes no state.
  r.ds_state = report(session, r.ok() && call.changes ? session.commit(*call.changes, call.base.get()) : nullptr);
  r.trace_json = std::move(call.trace_json);
}

void Host::InFlight::overrun() noexcept {
  Host& h = *host;
  const std::int64_t now = steady_now_ms();
  Response r = h.timeout_response(*tool, timeout_ms);
  r.ds_state = h.report(*session, nullptr);
  tool->breaker.record_failure(now);
  h.timeouts_.fetch_add(1, std::memory_order_relaxed);
  if (ticket != nullptr) store->complete(*ticket, r, IdempotencyStore::keeps(r), now);
  finished = true;
  if (overrun_sink != nullptr) {
    if (h.audit_) h.record_call(*request, r, started_ns);  // what the caller gets, now
    r.id_json = request->id_json;
    sent_to_sink = true;
    overrun_sink->deliver(std::move(r));
  } else {
    overrun_answer = std::move(r);
  }
}

}  // namespace machina
