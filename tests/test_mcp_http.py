"""MCP over Streamable HTTP at the `--http` front's /mcp: the official SDK's client in each of
its modes (the initialize handshake with its session, 2026-07-28 without one, and discovery),
and the transport's own rules on raw requests: the session header, 404 for a session that is
gone, DELETE, 202 for a notification, no GET stream, the front's Origin and token checks, and
a bounded number of sessions.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from jsonrpc_support import sdk_session
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from test_security_http import Served, http_request, start

ECHO = "AID.ECHO.v1"
MODERN = "2026-07-28"
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "tests", "version": "0"}}}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    host = start(tmp_path, "--http-mcp-sessions", "2", "--http-allow-origin", "http://app.example:3000")
    yield host
    host.proc.terminate()
    assert host.proc.wait(timeout=10) == 0


def url(served: Served) -> str:
    return f"http://127.0.0.1:{served.port}/mcp"


@pytest.mark.parametrize("mode", ["legacy", MODERN, "auto"])
def test_the_sdk_client_lists_and_calls_tools_over_http(served: Served, mode: str) -> None:
    out = sdk_session(url(served), mode)
    assert out["version"] == ("2025-11-25" if mode == "legacy" else MODERN)
    assert ECHO in {t.name for t in out["list"].tools}
    assert not out["echo"].is_error and out["echo"].structured_content == {"a": [1, "é"]}
    assert out["invalid"].is_error and out["invalid"].meta["machina/code"] == "schema_violation"
    assert out["unknown"].code == -32602 and "tool not found" in str(out["unknown"])


def test_the_sdk_client_sends_the_token_the_front_asks_for(tmp_path: Path) -> None:
    host = start(tmp_path, env={"MACHINA_TOOLHOST_HTTP_TOKEN": "s3cret"})
    try:
        async def session(token: str) -> set[str]:
            async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http:
                transport = streamable_http_client(url(host), http_client=http)
                async with Client(transport, mode="legacy", read_timeout_seconds=30) as client:
                    return {t.name for t in (await client.list_tools()).tools}
        assert ECHO in anyio.run(session, "s3cret")
        with pytest.raises(BaseException) as refused:  # (the SDK's task groups wrap its error)
            anyio.run(session, "wrong")
        assert "Server returned an error response" in repr(refused.value)
    finally:
        host.proc.terminate()
        assert host.proc.wait(timeout=10) == 0


def post(served: Served, message: dict[str, Any], session: str | None = None,
         extra: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
    headers = {"Host": f"127.0.0.1:{served.port}", "Content-Type": "application/json",
               "Accept": "application/json, text/event-stream", **(extra or {})}
    if session is not None:
        headers["Mcp-Session-Id"] = session
    return http_request(served.port, headers, json.dumps(message).encode(), path="/mcp")


def initialize(served: Served) -> str:
    status, headers, body = post(served, INITIALIZE)
    assert status == 200 and body["result"]["serverInfo"]["name"] == "machina-toolhost", body
    return headers["mcp-session-id"]


def test_a_session_is_opened_used_and_ended(served: Served) -> None:
    session = initialize(served)
    assert len(session) == 32
    status, _, body = post(served, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
    assert status == 202 and body is None
    status, _, body = post(served, {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                                    "params": {"name": ECHO, "arguments": {"x": 1}}}, session)
    assert status == 200 and body["result"]["structuredContent"] == {"x": 1}

    host_header = {"Host": f"127.0.0.1:{served.port}"}
    status, headers, _ = http_request(served.port, host_header, method="GET", path="/mcp")
    assert status == 405 and headers["allow"] == "POST, DELETE"

    status, _, _ = http_request(served.port, {**host_header, "Mcp-Session-Id": session}, method="DELETE",
                                path="/mcp")
    assert status == 204
    status, _, body = post(served, {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, session)
    assert status == 404 and body["error"]["type"] == "session_not_found"


def test_sessions_are_bounded_the_least_recently_used_makes_room(served: Served) -> None:
    first, second = initialize(served), initialize(served)
    assert post(served, {"jsonrpc": "2.0", "id": 2, "method": "ping"}, first)[0] == 200  # (first: used last)
    third = initialize(served)
    assert post(served, {"jsonrpc": "2.0", "id": 3, "method": "ping"}, second)[0] == 404
    for kept in (first, third):
        assert post(served, {"jsonrpc": "2.0", "id": 4, "method": "ping"}, kept)[0] == 200


def test_the_fronts_origin_rule_holds_at_mcp(served: Served) -> None:
    status, _, body = post(served, INITIALIZE, extra={"Origin": "http://evil.example"})
    assert status == 403 and body["error"]["type"] == "origin_not_allowed"
    status, headers, body = post(served, INITIALIZE, extra={"Origin": "http://app.example:3000"})
    assert status == 200 and headers["access-control-expose-headers"] == "Mcp-Session-Id"
    status, _, _ = post(served, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                        extra={"Content-Type": "text/plain"})
    assert status == 415


def test_a_message_without_a_session_is_served_on_its_own(served: Served) -> None:
    status, headers, body = post(served, {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                                          "params": {"name": ECHO, "arguments": {"y": 2}}})
    assert status == 200 and "mcp-session-id" not in headers
    assert body["id"] == 7 and body["result"]["structuredContent"] == {"y": 2}
    status, _, body = post(served, {"jsonrpc": "2.0", "id": 8, "method": "tools/call"})
    assert status == 200 and body["error"]["code"] == -32602


def test_a_method_name_that_is_not_utf8_is_answered_and_the_host_serves_on(served: Served) -> None:
    host_header = {"Host": f"127.0.0.1:{served.port}", "Content-Type": "application/json"}
    status, _, body = http_request(served.port, host_header, b'{"jsonrpc":"2.0","id":1,"method":"\xff"}',
                                   path="/mcp")
    assert status == 200 and body["error"]["code"] == -32601
    assert post(served, {"jsonrpc": "2.0", "id": 2, "method": "ping"})[0] == 200
    status, _, body = http_request(served.port, host_header, b"{not json", path="/mcp")
    assert status == 400 and body["error"]["code"] == -32700


def test_an_unknown_protocol_version_header_is_refused(served: Served) -> None:
    status, _, body = post(served, {"jsonrpc": "2.0", "id": 1, "method": "ping"},
                           extra={"MCP-Protocol-Version": "1999-01-01"})
    assert status == 400 and "1999-01-01" in body["error"]["message"]
    assert post(served, {"jsonrpc": "2.0", "id": 2, "method": "ping"},
                extra={"MCP-Protocol-Version": "2025-06-18"})[0] == 200
