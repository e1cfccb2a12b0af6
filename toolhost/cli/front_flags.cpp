// The command line's own options: modes, tools and the fronts' options.
#include "front_flags.hpp"

namespace machina::cli {

void FrontFlags::add(CLI::App& app) {
  app.add_option("--plugin", plugins, "Load this plugin library (repeatable)")->type_name("PATH");
  app.add_option("--tools", manifests,
                 "Load the tools this TOML tool manifest declares (Python tools, HTTP tool services), beside the "
                 "plugins' (repeatable; docs/python-tools.md)")
      ->type_name("FILE");
  app.add_option("--packs", packs_text,
                 "The built-in tool packs to serve, comma-separated (files, shell, code, python), or none (default: "
                 "all of them "
                 "when no plugin is named, else none; docs/tool-packs.md)")
      ->type_name("LIST");
  app.add_option("--policy", policy_file,
                 "The tool packs' security policy, a TOML file (default: $MACHINA_TOOLHOST_POLICY, else safe "
                 "defaults: files under the workspace, no command allowed; docs/tool-packs.md)")
      ->type_name("FILE");
  list_opt = app.add_flag("--list", list, "Print the registered tools as JSON and exit");
  run_opt = app.add_option("--run", run_args, "Run one call: read a JSON request from stdin, write one JSON response")
                ->expected(1, 2)
                ->type_name("[PLUGIN] AID");
  serve_opt =
      app.add_option("--serve", serve_args, "Serve NDJSON requests from stdin, one response line each, until EOF")
          ->expected(0, 1)
          ->type_name("[PLUGIN]");
  app.add_option("--workers", workers, "Calls run concurrently in --serve (responses with an id may come out of order)")
      ->check(CLI::Range(1u, 256u))
      ->capture_default_str();
  app.add_option("--spin-us", spin_us,
                 "In --serve, poll for the next request this many microseconds before sleeping (a lock-step "
                 "client's next call then costs no wake-up); 0: never. Only when the process may use two CPUs. "
                 "Given twice, the last counts")
      ->check(CLI::Range(0u, 10000u))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->capture_default_str();

  http_opt = app.add_option("--http", http_address,
                            "Serve tools over HTTP (tool protocol v1's service runner and capability handshake) on "
                            "this address (numeric, or localhost) and port (port 0: any free "
                            "one, said on stderr); bearer token from MACHINA_TOOLHOST_HTTP_TOKEN if set, required "
                            "off loopback; only JSON bodies, "
                            "the host's own Host names and no foreign Origin are served (docs/python-tools.md); "
                            "MCP over Streamable HTTP at /mcp (docs/mcp-and-skills.md)")
                 ->type_name("HOST:PORT");
  app.add_option("--http-max-connections", http.max_connections, "In --http, connections at once (more: 503)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{65536}))
      ->capture_default_str();
  app.add_option("--http-max-connections-per-peer", http.max_connections_per_peer,
                 "In --http, connections at once from one client address (more: 503)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{65536}))
      ->capture_default_str();
  app.add_option("--http-header-timeout-ms", http.header_timeout_ms,
                 "In --http, a request's headers must arrive within this (a new connection's: from its accept; "
                 "else 408 and the connection is closed)")
      ->check(CLI::Range(100, 600'000))
      ->capture_default_str();
  app.add_option("--http-mcp-sessions", http.max_mcp_sessions,
                 "In --http, MCP sessions kept at once (a new one beyond: the least recently used idle one ends)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{65536}))
      ->capture_default_str();
  app.add_option("--http-allow-origin", http.allow_origins,
                 "In --http, serve requests carrying this Origin (repeatable; a request with any other Origin: 403), "
                 "e.g. http://localhost:3000")
      ->type_name("ORIGIN");
  app.add_option("--http-allow-host", http.allow_hosts,
                 "In --http, serve requests whose Host is this name (any port; NAME:PORT pins one; repeatable) "
                 "beside the bound address and, on loopback, localhost (any other Host: 403)")
      ->type_name("NAME");
  nats_opt = app.add_option("--nats", nats.url,
                            "Serve every tool as a NATS micro service on the server at this URL (subjects "
                            "PREFIX.call, PREFIX.tools, PREFIX.tool.<aid>, the tools.* names; $SRV discovery; "
                            "docs/nats.md). Idempotency keys: this host's own cache, or one store shared by a "
                            "group of hosts (--nats-idempotency kv). "
                            "Default --workers: 32")
                 ->type_name("URL");
  app.add_option("--nats-prefix", nats.prefix, "In --nats, the subjects' prefix")->capture_default_str();
  app.add_option("--nats-queue-group", nats.queue_group,
                 "In --nats, the queue group: the hosts of one group share the calls")
      ->capture_default_str();
  app.add_option("--nats-max-pending", nats.max_pending,
                 "In --nats, messages waiting per subscription beyond the calls running; more are dropped (the "
                 "callers see no answer) and said on stderr")
      ->check(CLI::Range(1, 1'000'000))
      ->capture_default_str();
  app.add_option("--nats-idempotency", nats_idempotency,
                 "In --nats, where calls with an idempotency key are kept: local (this host's own cache) or kv (a "
                 "JetStream key-value bucket shared by the hosts of the group: a key runs its tool once on any "
                 "host; needs --kv-key-file)")
      ->check(CLI::IsMember({"local", "kv"}))
      ->capture_default_str();
  app.add_option("--nats-kv-bucket", nats.kv_bucket, "In --nats-idempotency kv, the key-value bucket's name")
      ->capture_default_str();
  app.add_option("--kv-key-file", kv_key_file,
                 "In --nats-idempotency kv, the file of the key (at least 32 bytes) the group's hosts sign the "
                 "shared store's entries with; their clients must not have it")
      ->type_name("FILE");
  app.add_option("--nats-kv-ttl-s", nats.kv_ttl_s,
                 "In --nats-idempotency kv, seconds an entry lasts (the bucket's maximum age, set when the first "
                 "host makes it)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{10} * 365 * 86400))
      ->capture_default_str();
  app.add_option("--nats-claim-grace-ms", nats.claim_grace_ms,
                 "In --nats-idempotency kv, how long past its call's deadline a claim holds before a duplicate is "
                 "told that the outcome is unknown (its host is taken for dead)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{86'400'000}))
      ->capture_default_str();
  app.add_flag("--nats-durable", nats.durable,
               "In --nats, also take calls from a JetStream work-queue stream (subject PREFIX.durable.call; "
               "at most 100000 messages or 256 MiB, beyond which a publish is refused; one re-sent within 2 minutes "
               "is dropped) through a "
               "durable pull consumer the hosts share: explicit acks, messages fetched only for idle workers, "
               "in progress while running, the answer to the Machina-Reply-To header, a call without an "
               "idempotency key keyed by its Nats-Msg-Id (docs/nats.md)");
  app.add_option("--nats-stream", nats.stream, "In --nats-durable, the stream's name")->capture_default_str();
  app.add_option("--nats-consumer", nats.consumer, "In --nats-durable, the consumer the hosts share")
      ->capture_default_str();
  app.add_option("--nats-ack-wait-s", nats.ack_wait_s,
                 "In --nats-durable, seconds a message may go unacknowledged and without word of progress before "
                 "it is delivered again (progress is said every third of it)")
      ->check(CLI::Range(0.1, 86400.0))
      ->capture_default_str();
  app.add_option("--nats-max-deliver", nats.max_deliver, "In --nats-durable, deliveries of one message at most")
      ->check(CLI::Range(1, 1'000'000))
      ->capture_default_str();
  mcp_opt = app.add_flag("--mcp")->description(
      "Serve every tool as an MCP server on stdio (JSON-RPC 2.0, one message a line; "
      "concurrent calls, cancellation, progress; docs/mcp-and-skills.md). Default --workers: 32");
  app.add_option("--mcp-page-size", mcp_page_size,
                 "In --mcp and --http's /mcp, tools per tools/list page (nextCursor for the rest)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{100000}))
      ->capture_default_str();
  skill_opt = app.add_flag("--skill")->description(
      "Serve every tool as a skill of the lifecycle/* layout on stdio (initialize, tools/call, lifecycle/*, "
      "shutdown; docs/mcp-and-skills.md). Default --workers: 32");
  app.add_flag("--state-per-call", state_per_call,
               "In --serve, each request runs with the ds_state it carries, or an empty one, and nothing is "
               "kept for the next (by default one state lives for the whole stream)");
}

void FrontFlags::add_no_audit(CLI::App& app) {
  no_audit_opt = app.add_flag("--no-audit", no_audit,
                              "Record no call (the audit store is on by default, in "
                              "$XDG_STATE_HOME/machina-toolhost/audit.db; also MACHINA_TOOLHOST_AUDIT=0)")
                     ->group("Audit");
}

void FrontFlags::exclude_modes() const {
  list_opt->excludes(run_opt)
      ->excludes(serve_opt)
      ->excludes(http_opt)
      ->excludes(mcp_opt)
      ->excludes(skill_opt)
      ->excludes(nats_opt);
  run_opt->excludes(serve_opt)->excludes(http_opt)->excludes(mcp_opt)->excludes(skill_opt)->excludes(nats_opt);
  serve_opt->excludes(http_opt)->excludes(mcp_opt)->excludes(skill_opt)->excludes(nats_opt);
  http_opt->excludes(mcp_opt)->excludes(skill_opt)->excludes(nats_opt);
  mcp_opt->excludes(skill_opt)->excludes(nats_opt);
  skill_opt->excludes(nats_opt);
}

bool FrontFlags::any_mode_but_run() const {
  return list || serve_opt->count() > 0 || http_opt->count() > 0 || mcp_opt->count() > 0 || skill_opt->count() > 0 ||
         nats_opt->count() > 0;
}

}  // namespace machina::cli
