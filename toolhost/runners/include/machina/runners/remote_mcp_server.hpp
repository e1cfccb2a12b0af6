// Tools of an MCP server reached over Streamable HTTP (a [[mcp_server]] with a `url`): the
// initialize handshake opens a session (its Mcp-Session-Id sent with every later message),
// tools/list page by page says what it has, and each call is one POST of tools/call whose
// answer is a JSON body or an event stream carrying the response. A session the server has
// ended (404) is opened again once, and the message sent again; a call past its deadline is
// answered `timeout` and the server told (notifications/cancelled). Every request carries
// the manifest's headers (a bearer token from the environment among them); https:// is
// verified against the system's CAs or the manifest's CA file. docs/mcp-and-skills.md.
#pragma once

#include <machina/http_client.hpp>
#include <machina/runner.hpp>
#include <machina/runners/hosted_server.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace machina {

struct RemoteMcpOptions {
  std::string name;                        // the server's (for messages)
  std::string url;                         // its MCP endpoint: http:// or https://
  http::Headers headers;                   // sent with every request
  std::string ca_file;                     // https: the CAs it is verified against ("": the system's)
  std::int64_t start_timeout_ms = 30'000;  // to open the session and list the tools
  std::size_t max_answer_bytes = 16u << 20;
};

class RemoteMcpServer {
 public:
  /// Throws ConfigError for a URL that is not http(s) or a client that cannot be made.
  explicit RemoteMcpServer(RemoteMcpOptions options);
  ~RemoteMcpServer();
  RemoteMcpServer(const RemoteMcpServer&) = delete;
  RemoteMcpServer& operator=(const RemoteMcpServer&) = delete;

  /// Opens the session and asks for the tools. Throws ConfigError saying why it could not.
  std::vector<RemoteTool> start();
  /// One call of the server's tool `tool`.
  RunOutcome call(const RunSpec& spec, const std::string& tool);
  /// Ends the session (DELETE). Idempotent.
  void close();

 private:
  /// What one request got: a result, an error, or no answer (`failure` says why).
  struct Answer {
    enum class Ending { result, error, timed_out, failed } ending = Ending::failed;
    std::string result;  // raw JSON
    int code = 0;
    std::string message;
    std::int64_t id = 0;
  };
  /// The session messages are sent in: its id ("": the server named none) and revision.
  struct Session {
    std::string id;
    std::string version;
  };
  Answer request(const std::string& method, const std::string& params, std::int64_t deadline_ms);
  /// One message in `session`; `session_gone`: the server answered 404 to it; `session_id`:
  /// where to put the session the answer names.
  Answer send_once(const std::string& method, const std::string& params, std::int64_t deadline_ms,
                   const Session& session, bool& session_gone, std::string* session_id = nullptr);
  void notify(const std::string& method, const std::string& params, std::int64_t deadline_ms, const Session& session);
  /// initialize and notifications/initialized, then the new session in use; false with `why`.
  bool open_session(std::int64_t deadline_ms, std::string& why);
  http::Headers headers_with(const Session& session) const;
  Session current();

  RemoteMcpOptions options_;
  http::Url url_;
  std::unique_ptr<http::Client> client_;
  std::mutex mu_;
  Session session_;  // the one in use
  bool closed_ = false;
  std::timed_mutex open_mu_;  // one handshake at a time
  std::atomic<std::int64_t> next_id_{1};
};

/// One tool of a remote MCP server.
class RemoteMcpToolRunner final : public Runner {
 public:
  RemoteMcpToolRunner(std::shared_ptr<RemoteMcpServer> server, std::string tool)
      : server_(std::move(server)), tool_(std::move(tool)) {}
  RunOutcome run(const RunSpec& spec) override { return server_->call(spec, tool_); }
  void close() override { server_->close(); }
  std::string_view kind() const override { return "mcp"; }

 private:
  std::shared_ptr<RemoteMcpServer> server_;
  std::string tool_;
};

}  // namespace machina
