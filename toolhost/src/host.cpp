// The request pipeline; see host.hpp and docs/protocol.md for the order of the rules.
#include <machina/host.hpp>
#include <machina/json_text.hpp>
#include <machina/wire.hpp>

#include <chrono>
#include <cstdlib>
#include <cstring>

#include <unistd.h>

namespace machina {

std::int64_t steady_now_ms() noexcept {
  using namespace std::chrono;
  return duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count();
}

std::int64_t unix_now_ms() noexcept {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

HostOptions HostOptions::from_env() {
  HostOptions o;
  if (const char* v = std::getenv("MACHINA_LEASE_ENFORCE")) o.lease_enforce = std::strcmp(v, "1") == 0;
  if (const char* v = std::getenv("MACHINA_LEASE_LEDGER"); v != nullptr && *v != '\0') {
    o.lease.ledger_dir = v;
  } else {
    // Every process of one user shares a ledger by default, so a lease used by one
    // --run or one serve process of a pool cannot be replayed against another.
    const char* runtime = std::getenv("XDG_RUNTIME_DIR");
    o.lease.ledger_dir = (runtime != nullptr && *runtime != '\0')
                             ? std::string(runtime) + "/machina-toolhost/leases"
                             : "/tmp/machina-toolhost-" + std::to_string(getuid()) + "/leases";
  }
  return o;
}

namespace {

/// The machina_call a tool sees: collects output, error and slot changes.
struct CallContext {
  std::size_t max_output;
  Session* session;
  std::string output;
  bool output_set = false;
  bool output_overflow = false;
  std::string error;
  std::shared_ptr<const Slots> base;    // taken on first read
  std::unique_ptr<SlotChanges> changes;  // made on first write

  const Slots& state() {
    if (!base) base = session->snapshot();
    return *base;
  }
  SlotChanges& writes() {
    if (!changes) changes = std::make_unique<SlotChanges>();
    return *changes;
  }
};

CallContext& ctx(machina_call* call) { return *reinterpret_cast<CallContext*>(call); }

int api_set_output(machina_call* call, const char* json, std::size_t len) {
  CallContext& c = ctx(call);
  if (len > c.max_output) {
    c.output_overflow = true;
    return -1;
  }
  c.output.assign(json, len);
  c.output_set = true;
  return 0;
}

void api_set_error(machina_call* call, const char* message, std::size_t len) {
  ctx(call).error = to_valid_utf8(std::string_view(message, len));
}

int api_slot_get(machina_call* call, std::uint32_t slot, machina_artifact* out) {
  if (slot >= kDsSlots || out == nullptr) return -1;
  CallContext& c = ctx(call);
  const auto bit = static_cast<std::uint8_t>(1u << slot);
  const std::optional<Artifact>* a = nullptr;
  if (c.changes && (c.changes->set & bit)) a = &c.changes->slots[slot];
  else if (!c.changes || !(c.changes->removed & bit)) a = &c.state()[slot];
  if (a == nullptr || !a->has_value()) return 0;
  const Artifact& v = **a;
  *out = machina_artifact{v.type.data(),       v.type.size(),       v.content_json.data(),
                          v.content_json.size(), v.provenance.data(), v.provenance.size(),
                          v.size_bytes};
  return 1;
}

int api_slot_set(machina_call* call, std::uint32_t slot, const machina_artifact* a) {
  if (slot >= kDsSlots || a == nullptr) return -1;
  const std::string_view type(a->type, a->type_len), content(a->content_json, a->content_json_len),
      provenance(a->provenance, a->provenance_len);
  if (!is_valid_utf8(type) || !is_valid_utf8(provenance) || !validate_json(content)) return -1;
  CallContext& c = ctx(call);
  const auto bit = static_cast<std::uint8_t>(1u << slot);
  SlotChanges& w = c.writes();
  w.slots[slot] = Artifact{std::string(type), std::string(content), std::string(provenance), a->size_bytes};
  w.set |= bit;
  w.removed &= static_cast<std::uint8_t>(~bit);
  return 0;
}

int api_slot_clear(machina_call* call, std::uint32_t slot) {
  if (slot >= kDsSlots) return -1;
  CallContext& c = ctx(call);
  const auto bit = static_cast<std::uint8_t>(1u << slot);
  SlotChanges& w = c.writes();
  w.slots[slot].reset();
  w.set &= static_cast<std::uint8_t>(~bit);
  w.removed |= bit;
  return 0;
}

const machina_host_api kHostApi{MACHINA_PLUGIN_ABI_VERSION, sizeof(machina_host_api), &api_set_output,
                                &api_set_error, &api_slot_get, &api_slot_set, &api_slot_clear};

}  // namespace

Host::Host(HostOptions options)
    : options_(std::move(options)), registry_(options_.breaker), idempotency_(options_.idempotency) {
  if (options_.lease_enforce) leases_ = std::make_unique<LeaseAuthority>(load_lease_secret(), options_.lease);
}

std::vector<std::string> Host::load_plugin(const std::string& path) { return registry_.load_plugin(path); }

Response Host::request_too_large() const {
  return Response::failure(ErrorKind::request_too_large,
                           "request exceeds the " + std::to_string(options_.max_request_bytes) + "-byte cap");
}

DsReport Host::report(Session& session, std::shared_ptr<const SlotChanges> changes) const {
  if (session.respond_with_delta()) return {DsReport::Mode::delta, std::move(changes)};
  return {DsReport::Mode::full, session.as_changes()};
}

bool Host::handle_json(std::string_view text, Session& session, std::string& out, std::string_view aid_override,
                       bool nul_terminated) {
  const Response response = respond_json(text, session, aid_override, nul_terminated);
  encode_response(response, out);
  return !response.id_json.empty();
}

Response Host::respond_json(std::string_view text, Session& session, std::string_view aid_override,
                            bool nul_terminated) {
  if (text.size() > options_.max_request_bytes) return request_too_large();
  Request request;
  Response error;
  if (!decode_request(text, request, error, nul_terminated)) return error;
  if (!aid_override.empty()) {
    if (!request.aid.empty() && request.aid != aid_override) {
      error = Response::failure(ErrorKind::malformed_request, "malformed request: the body names aid '" +
                                                                 request.aid + "' but the command line names '" +
                                                                 std::string(aid_override) + "'");
      error.id_json = std::move(request.id_json);
      return error;
    }
    request.aid = aid_override;
  }
  return handle(request, session);
}

Response Host::handle(Request& request, Session& session) {
  Response r;
  try {
    r = handle_checked(request, session);
  } catch (const std::exception& e) {
    r = Response::failure(ErrorKind::internal_error, std::string("internal error: ") + e.what());
  }
  r.id_json = std::move(request.id_json);
  return r;
}

Response Host::handle_checked(Request& request, Session& session) {
  if (request.aid.empty()) return Response::failure(ErrorKind::malformed_request, "malformed request: missing field 'aid'");
  // The state a request carries is applied even if the call then fails, so the
  // session stays the mirror of what the caller sent.
  if (request.ds_state) session.apply(*request.ds_state);

  const Tool* tool = registry_.find(request.aid);
  if (tool == nullptr) return Response::failure(ErrorKind::tool_not_found, "tool not found: " + request.aid);

  if (leases_ && tool->info.tier > 0) {
    if (!request.lease_token) {
      Response r = Response::failure(ErrorKind::lease_required, "lease_required");
      r.lease_tier = tool->info.tier;
      r.lease_aid = tool->info.aid;
      return r;
    }
    if (auto why = leases_->redeem(*request.lease_token, tool->info.aid, unix_now_ms())) {
      Response r = Response::failure(ErrorKind::lease_rejected, "lease_rejected");
      r.lease_reason = std::move(*why);
      return r;
    }
  }

  const std::int64_t now = steady_now_ms();
  if (!request.idempotency_key) return execute(*tool, request, session, now);

  const std::string& key = *request.idempotency_key;
  const auto fp = IdempotencyCache::fingerprint(request.input_json);
  auto ticket = idempotency_.begin(tool->info.aid, key, fp, now);
  switch (ticket.outcome) {
    case IdempotencyCache::Outcome::conflict:
      return Response::failure(ErrorKind::idempotency_conflict,
                               "idempotency_key was already used with a different input for " + tool->info.aid);
    case IdempotencyCache::Outcome::wait:
      ticket.response = IdempotencyCache::wait(ticket.flight);
      [[fallthrough]];
    case IdempotencyCache::Outcome::hit: {
      Response r = std::move(ticket.response);
      r.idempotent_hit = true;
      r.ds_state = report(session, nullptr);  // a hit changes no state: an empty delta in serve mode
      return r;
    }
    case IdempotencyCache::Outcome::run: break;
  }
  Response r;
  try {
    r = execute(*tool, request, session, now);
  } catch (...) {
    idempotency_.complete(tool->info.aid, key, ticket.flight,
                          Response::failure(ErrorKind::internal_error, "internal error"), false, steady_now_ms());
    throw;
  }
  const bool keep = r.ok() || r.kind == ErrorKind::tool_error;
  idempotency_.complete(tool->info.aid, key, ticket.flight, r, keep, steady_now_ms());
  return r;
}

Response Host::execute(const Tool& tool, const Request& request, Session& session, std::int64_t now) {
  auto with_state = [&](Response r) {
    r.ds_state = report(session, nullptr);
    return r;
  };
  if (!tool.breaker.allow(now)) {
    return with_state(Response::failure(
        ErrorKind::breaker_open, "circuit breaker open for " + tool.info.aid + ": too many host-side failures"));
  }
  std::string why;
  if (!validate_json(request.input_json, &why)) {
    return with_state(Response::failure(ErrorKind::invalid_input, "input_json is not valid JSON: " + why));
  }
  if (tool.schema) {
    const auto input = nlohmann::json::parse(request.input_json);
    if (auto err = tool.schema->validate(input)) {
      return with_state(Response::failure(ErrorKind::schema_violation,
                                          "input_json does not match the input schema of " + tool.info.aid + ": " + *err));
    }
  }

  CallContext call{options_.max_output_bytes, &session, {}, false, false, {}, nullptr, nullptr};
  const int rc = tool.invoke(tool.tool_data, &kHostApi, reinterpret_cast<machina_call*>(&call),
                             request.input_json.c_str(), request.input_json.size());

  Response r;
  if (call.output_overflow) {
    r = Response::failure(ErrorKind::output_too_large, "tool output exceeds the " +
                                                           std::to_string(options_.max_output_bytes) + "-byte cap");
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

  const std::int64_t end = steady_now_ms();
  if (error_info(r.kind).counts_for_breaker) tool.breaker.record_failure(end);
  else tool.breaker.record_success(end);

  // A failed call changes no state.
  r.ds_state = report(session, r.ok() && call.changes ? session.commit(*call.changes) : nullptr);
  return r;
}

}  // namespace machina
