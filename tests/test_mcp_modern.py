"""MCP revision 2026-07-28 (no initialize, no session: server/discover and a per-request
`_meta` envelope), beside the handshake revisions. The official SDK's client, pinned to
2026-07-28 and in its auto mode, lists and calls tools of `machina-toolhost --mcp`; the same
lines sent to --mcp and to the SDK's own stdio server get the same protocol answers; and the
host speaks 2026-07-28 to a hosted server that serves it (md.Mcp), the handshake to one that
does not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import machina_dispatch as md
import pytest
from conftest import TOOLHOST
from jsonrpc_support import LineClient, manifest, mcp_server_command, sdk_session, skill_env
from mcp import Client, StdioServerParameters

ECHO = "AID.ECHO.v1"
MODERN = "2026-07-28"
VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"
ENVELOPE = {VERSION_KEY: MODERN, "io.modelcontextprotocol/clientInfo": {"name": "tests", "version": "0"},
            CAPABILITIES_KEY: {}}


def front_params(tmp_path: Path, *args: str) -> StdioServerParameters:
    return StdioServerParameters(command=TOOLHOST, args=["--mcp", *args],
                                 env={"XDG_STATE_HOME": str(tmp_path / "state")})


def with_envelope(params: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    out = dict(params or {})
    out["_meta"] = {**ENVELOPE, **meta}
    return out


# --- the official SDK's client ------------------------------------------------------------------------


def test_the_sdk_client_pinned_to_2026_07_28_lists_and_calls_tools(tmp_path: Path) -> None:
    """The handshake-only front failed this in list_tools: the SDK's 2026 ListToolsResult
    requires cacheScope, resultType and ttlMs."""
    out = sdk_session(front_params(tmp_path), MODERN)
    assert out["version"] == MODERN
    listed = out["list"]
    assert (listed.cache_scope, listed.ttl_ms, listed.result_type) == ("private", 0, "complete")
    assert ECHO in {t.name for t in listed.tools}
    echo = out["echo"]
    assert echo.result_type == "complete" and not echo.is_error and echo.structured_content == {"a": [1, "é"]}
    invalid = out["invalid"]
    assert invalid.is_error and invalid.meta["machina/code"] == "schema_violation"
    assert invalid.meta[SERVER_INFO_KEY]["name"] == "machina-toolhost"
    assert out["unknown"].code == -32602 and "tool not found" in str(out["unknown"])


def test_the_sdk_client_in_auto_mode_discovers_2026_07_28(tmp_path: Path) -> None:
    """Its probe, server/discover, was answered -32601 by the handshake-only front: the
    client fell back to 2025-11-25."""
    m = manifest(tmp_path, [("mcp_server", {"name": "sdk", "command": mcp_server_command()})])
    seen: list[tuple[float, float | None, str | None]] = []

    async def session() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with Client(front_params(tmp_path, "--tools", str(m)), read_timeout_seconds=60) as client:
            out["version"] = client.protocol_version
            out["server"] = client.server_info
            out["capabilities"] = client.server_capabilities
            out["tools"] = {t.name for t in (await client.list_tools()).tools}

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                seen.append((progress, total, message))
            out["slow"] = await client.call_tool("AID.MCP.SDK.SLOW.v1", {"seconds": 0.1, "steps": 2},
                                                 progress_callback=on_progress)
            out["add"] = await client.call_tool("AID.MCP.SDK.ADD.v1", {"a": 2, "b": 3})
        return out

    out = anyio.run(session)
    assert out["version"] == MODERN
    assert out["server"] is not None and out["server"].name == "machina-toolhost"
    assert out["capabilities"].tools is not None
    assert {ECHO, "AID.MCP.SDK.ADD.v1"} <= out["tools"]
    assert out["add"].structured_content == {"sum": 5, "inputs": [2, 3]} and out["add"].result_type == "complete"
    assert out["slow"].structured_content == {"result": "slept 0.1"}
    assert seen == [(1.0, 2.0, "step 1 of 2"), (2.0, 2.0, "step 2 of 2")]


# --- the protocol, line by line, beside the SDK's own server -------------------------------------------------


def front(tmp_path: Path) -> LineClient:
    return LineClient([TOOLHOST, "--mcp"], env=skill_env(tmp_path))


def sdk_server(tmp_path: Path) -> LineClient:
    return LineClient(mcp_server_command(), env=skill_env(tmp_path))


def error_of(answer: dict[str, Any]) -> tuple[int, str, Any]:
    assert "error" in answer, answer
    e = answer["error"]
    data = e.get("data")
    if isinstance(data, dict) and set(data) == {"status", "code"}:
        data = None  # (the host's own status and code, which the SDK's server has no notion of)
    return e["code"], e["message"], data


def modern_refusals(c: LineClient) -> list[tuple[int, str, Any]]:
    """What a 2026-07-28 connection refuses, in the order a client could send it."""
    return [
        error_of(c.request("tools/list", {})),
        error_of(c.request("tools/list", {"_meta": {VERSION_KEY: MODERN}})),
        error_of(c.request("tools/list", {"_meta": {VERSION_KEY: "2099-01-01", CAPABILITIES_KEY: {}}})),
        error_of(c.request("tools/list", {"_meta": {VERSION_KEY: 20260728, CAPABILITIES_KEY: {}}})),
        error_of(c.request("ping", with_envelope())),
        error_of(c.request("bogus/method", with_envelope())),
        error_of(c.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                          "clientInfo": {"name": "tests", "version": "0"}})),
        error_of(c.request("initialize", {})),
    ]


@pytest.mark.parametrize("serve", [front, sdk_server], ids=["front", "sdk"])
def test_a_first_request_with_the_envelope_opens_a_2026_07_28_connection(serve: Any, tmp_path: Path) -> None:
    with serve(tmp_path) as c:
        discovered = c.result("server/discover", with_envelope())
        assert {k: discovered[k] for k in ("supportedVersions", "resultType", "cacheScope", "ttlMs")} == {
            "supportedVersions": [MODERN], "resultType": "complete", "cacheScope": "private", "ttlMs": 0}
        assert discovered["capabilities"]["tools"] is not None and SERVER_INFO_KEY in discovered["_meta"]
        listed = c.result("tools/list", with_envelope())
        assert (listed["resultType"], listed["cacheScope"], listed["ttlMs"]) == ("complete", "private", 0)
        assert SERVER_INFO_KEY in listed["_meta"] and listed["tools"]
        refusals = modern_refusals(c)
        assert refusals == [
            (-32602, "params._meta must be an object carrying the required "
                     f"'{VERSION_KEY}' and '{CAPABILITIES_KEY}' envelope keys", None),
            (-32602, f"params._meta is missing the required envelope key(s): {CAPABILITIES_KEY}", None),
            (-32022, "Unsupported protocol version", {"supported": [MODERN], "requested": "2099-01-01"}),
            (-32602, "the protocol-version envelope value must be a string", None),
            (-32601, "Method not found", "ping"),
            (-32601, "Method not found", "bogus/method"),
            (-32022, "connection is serving the 2026-07-28 protocol; the initialize handshake is not accepted",
             {"supported": [MODERN], "requested": "2025-11-25"}),
            (-32022, "connection is serving the 2026-07-28 protocol; the initialize handshake is not accepted",
             {"supported": [MODERN]}),
        ]


@pytest.mark.parametrize("serve", [front, sdk_server], ids=["front", "sdk"])
def test_a_handshake_connection_refuses_the_envelope(serve: Any, tmp_path: Path) -> None:
    with serve(tmp_path) as c:
        first = c.result("initialize", with_envelope({"protocolVersion": MODERN, "capabilities": {},
                                                      "clientInfo": {"name": "tests", "version": "0"}}))
        assert first["protocolVersion"] == "2025-11-25"  # (initialize opens a handshake connection, envelope or not)
        c.send("notifications/initialized", notify=True)
        assert error_of(c.request("tools/list", with_envelope())) == (
            -32600, "this connection serves the handshake protocol era; "
                    "requests carrying the 2026-07-28 envelope are not accepted on it", None)
        assert error_of(c.request("server/discover", {})) == (-32601, "Method not found", "server/discover")
        listed = c.result("tools/list", {})
        assert "resultType" not in listed and "ttlMs" not in listed and "cacheScope" not in listed


def test_calls_on_a_2026_07_28_connection(tmp_path: Path) -> None:
    with front(tmp_path) as c:
        ok = c.result("tools/call", with_envelope({"name": ECHO, "arguments": {"x": 1}}))
        assert ok["resultType"] == "complete" and ok["structuredContent"] == {"x": 1} and ok["isError"] is False
        assert ok["_meta"] == {SERVER_INFO_KEY: {"name": "machina-toolhost", "version": md.__version__}}
        failed = c.result("tools/call", with_envelope({"name": "AID.TEXT.STATS.v1", "arguments": {"text": 5}}))
        assert failed["resultType"] == "complete" and failed["isError"] is True
        assert failed["_meta"]["machina/code"] == "schema_violation" and SERVER_INFO_KEY in failed["_meta"]
        # The host's own _meta keys ride beside the envelope's.
        keyed = c.result("tools/call", with_envelope({"name": ECHO, "arguments": {}},
                                                     **{"machina/idempotency_key": "k1"}))
        again = c.result("tools/call", with_envelope({"name": ECHO, "arguments": {}},
                                                     **{"machina/idempotency_key": "k1"}))
        assert "machina/idempotent_hit" not in keyed["_meta"] and again["_meta"]["machina/idempotent_hit"] is True
        assert error_of(c.request("tools/call", with_envelope({"name": "AID.NOPE.v1"})))[0] == -32602
        # A call without the envelope is refused before it runs.
        assert error_of(c.request("tools/call", {"name": ECHO, "arguments": {}}))[0] == -32602


# --- md.Mcp: the host as a client of a 2026-07-28 server -------------------------------------------------


def era_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []


def test_md_mcp_speaks_2026_07_28_to_a_server_that_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The handshake-only runner sent initialize: the server served it at 2025-11-25."""
    log = tmp_path / "era.log"
    monkeypatch.setenv("ERA_LOG", str(log))
    t = md.Mcp(mcp_server_command("era_server.py"), name="era", env=["ERA_LOG"])
    try:
        assert sorted(t.tools) == ["add", "ask", "era"]
        assert t.call("era").output == MODERN
        assert t.call("add", {"a": 2, "b": 40}).output == {"sum": 42}
        # A result that asks the client for more: this host has no one to ask.
        asked = t.call("ask", check=False)
        assert (asked.status, asked.code) == ("TOOL_ERROR", "tool_error")
        assert asked.error == ("the server answered resultType input_required, which asks its client for more; "
                               "this host answers only complete results")
    finally:
        t.close()
    seen = era_log(log)
    assert [e["method"] for e in seen] == ["server/discover", "tools/list"] + ["tools/call"] * 3
    assert all(e["version"] == MODERN and e["enveloped"] for e in seen)


def test_md_mcp_falls_back_to_the_handshake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server of the handshake revisions alone: the probe is refused, initialize follows."""
    log = tmp_path / "era.log"
    monkeypatch.setenv("ERA_LOG", str(log))
    t = md.Mcp(mcp_server_command("era_server.py") + ["--handshake-only"], name="era", env=["ERA_LOG"])
    try:
        assert t.call("era").output == "2025-11-25"
        assert t.call("add", {"a": 1, "b": 1}).output == {"sum": 2}
    finally:
        t.close()
    seen = era_log(log)
    assert [e["method"] for e in seen] == ["server/discover", "initialize", "tools/list", "tools/call", "tools/call"]
    assert not any(e["enveloped"] for e in seen[1:])



@pytest.mark.parametrize("mode,era", [("silent", "2025-11-25"), ("late", MODERN)])
def test_md_mcp_when_the_probe_is_not_answered_in_time(mode: str, era: str) -> None:
    """The probe has at most half the time to start (10 s at most): a server that leaves it
    unanswered gets the handshake in the other half; one that refuses the handshake with
    -32022 naming 2026-07-28 (it took the probe, and answers it too late) gets 2026-07-28."""
    t = md.Mcp(mcp_server_command("unanswered_probe_server.py") + [mode], name="slow", start_timeout=1.0)
    try:
        assert t.call("era").output == era
    finally:
        t.close()
