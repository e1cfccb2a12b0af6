"""machina-toolhost --mcp: every registered tool served as an MCP server on stdio. The
official MCP Python SDK's client lists and calls tools of every kind (plugins, a Python tool,
a skill, a hosted MCP server); the protocol's edges are driven line by line (version
negotiation, the 2026 revision's discover, ping, malformed input, pagination, _meta fields,
many requests in flight, cancellation, progress); and the protocol transcripts are replayed
through it with equivalent results."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
import machina_dispatch as md
import pytest
from conftest import HANG_GUARD_S, LEASE_SECRET, PAST_GUARD_MS, TOOLHOST, most_at_once, scaled
from jsonrpc_support import LineClient, manifest, mcp_server_command, probe_log, probe_skill, skill_env, wait_for
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError
from process_tree import alive
from python_support import python_tool, write_pack
from test_transcripts import TRANSCRIPT_FILES, load_transcript

ECHO = "AID.ECHO.v1"


@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    """A manifest with a Python tool, the tests' skill and the SDK-written MCP server."""
    pack = write_pack(tmp_path / "pack", [python_tool("AID.PY.GREET.v1", "tools.sample_tool:greet"),
                                          python_tool("AID.PY.SLEEP.v1", "tools.sample_tool:sleep")])
    skill = probe_skill(tmp_path)
    text = pack.read_text() + "\n" + manifest(tmp_path, [
        ("skill", {"dir": str(skill)}),
        ("mcp_server", {"name": "sdk", "command": mcp_server_command(), "env": ["CANCEL_LOG"]}),
    ], name="children.toml").read_text()
    pack.write_text(text)
    return pack


def mcp_client(tmp_path: Path, *args: str, **env: str) -> LineClient:
    return LineClient([TOOLHOST, "--mcp", *args], env=skill_env(tmp_path, env))


def initialize(c: LineClient, version: str = "2025-11-25") -> dict[str, Any]:
    result: dict[str, Any] = c.result("initialize", {"protocolVersion": version, "capabilities": {},
                                                     "clientInfo": {"name": "tests", "version": "0"}})
    c.send("notifications/initialized", notify=True)
    return result


def call(c: LineClient, name: str, arguments: Any = None, meta: dict[str, Any] | None = None, id: Any = None) -> Any:
    params: dict[str, Any] = {"name": name}
    if arguments is not None:
        params["arguments"] = arguments
    if meta is not None:
        params["_meta"] = meta
    return c.send("tools/call", params, id=id)


# --- the official SDK's client ------------------------------------------------------------------------


def test_the_sdk_client_lists_and_calls_tools_of_every_kind(mixed: Path, tmp_path: Path) -> None:
    async def session() -> dict[str, Any]:
        params = StdioServerParameters(command=TOOLHOST, args=["--mcp", "--tools", str(mixed)],
                                       env={"XDG_STATE_HOME": str(tmp_path / "state")})
        out: dict[str, Any] = {}
        # (The handshake revisions; the client's auto mode: tests/test_mcp_modern.py.)
        async with Client(params, read_timeout_seconds=60, mode="legacy") as client:
            out["version"] = client.protocol_version
            assert client.server_info is not None
            out["server"] = client.server_info.name
            tools = (await client.list_tools()).tools
            out["tools"] = {t.name: t for t in tools}
            out["echo"] = await client.call_tool(ECHO, {"a": [1, "é"]})
            out["stats"] = await client.call_tool("AID.TEXT.STATS.v1", {"text": "a b a"})
            out["python"] = await client.call_tool("AID.PY.GREET.v1", {"name": "Ada"})
            out["skill"] = await client.call_tool("AID.SKILL.PROBE.STRUCTURED.v1", {"n": 3})
            out["hosted"] = await client.call_tool("AID.MCP.SDK.ADD.v1", {"a": 2, "b": 3})
            out["failing"] = await client.call_tool("AID.MCP.SDK.FAIL.v1", {"message": "no"})
            out["invalid"] = await client.call_tool("AID.TEXT.STATS.v1", {"text": 5})
            try:
                await client.call_tool("AID.NOPE.v1", {})
            except MCPError as e:
                out["unknown"] = e
        return out

    out = anyio.run(session)
    assert out["version"] == "2025-11-25" and out["server"] == "machina-toolhost"
    tools = out["tools"]
    assert {ECHO, "AID.PY.GREET.v1", "AID.SKILL.PROBE.ECHO.v1", "AID.MCP.SDK.ADD.v1"} <= tools.keys()
    add = tools["AID.MCP.SDK.ADD.v1"]
    assert add.title == "Adder" and add.output_schema["properties"].keys() == {"sum", "inputs"}
    assert add.annotations.read_only_hint is True  # the hosted server's own annotations
    stats = tools["AID.TEXT.STATS.v1"]
    assert stats.input_schema["required"] == ["text"]
    assert stats.annotations.read_only_hint is True and stats.annotations.destructive_hint is False
    write = tools["AID.FILE.WRITE.v1"]
    assert write.annotations.read_only_hint is False  # tier 1
    assert out["echo"].structured_content == {"a": [1, "é"]} and not out["echo"].is_error
    assert out["echo"].content[0].text == json.dumps({"a": [1, "é"]}, ensure_ascii=False, separators=(",", ":"))
    assert out["stats"].structured_content["words"] == 3
    assert out["python"].structured_content == {"message": "Hello Ada", "ok": True}
    assert out["skill"].structured_content == {"n": 3}
    assert out["hosted"].structured_content == {"sum": 5, "inputs": [2, 3]}
    assert out["failing"].is_error and out["failing"].content[0].text == "Error executing tool fail"
    assert out["failing"].meta["machina/code"] == "tool_error"
    invalid = out["invalid"]
    assert invalid.is_error and invalid.meta["machina/code"] == "schema_violation"
    assert out["unknown"].code == -32602 and "tool not found" in str(out["unknown"])


def test_the_sdk_client_sees_progress_of_a_hosted_server(mixed: Path, tmp_path: Path) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def session() -> Any:
        params = StdioServerParameters(command=TOOLHOST, args=["--mcp", "--tools", str(mixed)],
                                       env={"XDG_STATE_HOME": str(tmp_path / "state")})
        async with Client(params, read_timeout_seconds=60) as client:
            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                seen.append((progress, total, message))
            return await client.call_tool("AID.MCP.SDK.SLOW.v1", {"seconds": 0.2, "steps": 3},
                                          progress_callback=on_progress)

    result = anyio.run(session)
    assert result.structured_content == {"result": "slept 0.2"}
    assert seen == [(1.0, 3.0, "step 1 of 3"), (2.0, 3.0, "step 2 of 3"), (3.0, 3.0, "step 3 of 3")]


# --- the protocol, line by line -----------------------------------------------------------------------------


@pytest.mark.parametrize("asked,answered", [("2025-06-18", "2025-06-18"), ("2025-11-25", "2025-11-25"),
                                            ("2025-03-26", "2025-03-26"), ("2024-11-05", "2024-11-05"),
                                            ("2026-07-28", "2025-11-25"), ("2099-01-01", "2025-11-25"),
                                            ("", "2025-11-25")])
def test_version_negotiation(asked: str, answered: str, tmp_path: Path) -> None:
    with mcp_client(tmp_path) as c:
        result = initialize(c, asked)
        assert result["protocolVersion"] == answered
        assert result["capabilities"] == {"tools": {"listChanged": False}}
        assert result["serverInfo"]["name"] == "machina-toolhost"


def test_newer_revisions_are_answered_so_clients_fall_back(tmp_path: Path) -> None:
    """server/discover without the 2026-07-28 `_meta` envelope is a request of the handshake
    revisions, where it is no method: -32601, and the connection goes on with the handshake
    (with the envelope it opens a 2026-07-28 connection: tests/test_mcp_modern.py)."""
    with mcp_client(tmp_path) as c:
        answer = c.request("server/discover", {})
        assert answer["error"]["code"] == -32601 and answer["error"]["data"] == "server/discover"
        assert c.result("ping") == {}
        initialize(c)
        assert c.result("ping") == {}


def test_malformed_input_gets_the_standard_codes(tmp_path: Path) -> None:
    with mcp_client(tmp_path) as c:
        initialize(c)
        cases: list[tuple[str | bytes, Any, int]] = [
            ("{not json", None, -32700),
            (b'{"jsonrpc": "2.0", "id": 10, "method": "\xff"}', 10, -32601),  # (not UTF-8: named in the error)
            ("[]", None, -32600),
            ('{"id": 1, "method": "ping"}', 1, -32600),  # no "jsonrpc": "2.0"
            ('{"jsonrpc": "2.0", "id": true, "method": "ping"}', None, -32600),
            ('{"jsonrpc": "2.0", "id": 1.5, "method": "ping"}', None, -32600),
            ('{"jsonrpc": "2.0", "id": 2, "method": "resources/list"}', 2, -32601),
            ('{"jsonrpc": "2.0", "id": 3, "method": "tools/call"}', 3, -32602),
            ('{"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": 5}}', 4, -32602),
            ('{"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "AID.ECHO.v1", "arguments": []}}',
             5, -32602),
            ('{"jsonrpc": "2.0", "id": "s", "method": "tools/call", "params": {"name": "AID.ECHO.v1", '
             '"_meta": {"machina/timeout_ms": "soon"}}}', "s", -32602),
            ('{"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "AID.ECHO.v1", '
             '"_meta": {"machina/timeout_ms": 0}}}', 6, -32602),
            ('{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "AID.ECHO.v1", '
             '"_meta": {"machina/ds_state": {"slots": 5}}}}', 7, -32602),
            ('{"jsonrpc": "2.0", "id": 8, "method": "tools/list", "params": {"cursor": "x"}}', 8, -32602),
            # Nested past 512 (RapidJSON's reader recurses: so deep a nesting would overflow the stack).
            ("[" * 300_000, None, -32700),
            ('{"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "AID.ECHO.v1", '
             '"arguments": {"a": ' + "[" * 300_000 + "]" * 300_000 + "}}}", None, -32700),
        ]
        for line, id, code in cases:
            c.send_raw(line)
            answer = c.answer(id if id is not None else None)
            assert answer["error"]["code"] == code, (line, answer)
        # A notification never gets an answer; the host keeps serving.
        c.send("notifications/whatever", {}, notify=True)
        assert c.result("ping") == {}
        assert c.close() == 0


def test_arguments_the_host_must_judge_are_judged_as_before(tmp_path: Path) -> None:
    # The front's own parse spares the host a second check of plain arguments; whatever
    # that parse is not sure of (a control character, a number past a double, ill-formed
    # UTF-8 in a string or a key, a lone surrogate) still gets the host's own answer.
    with mcp_client(tmp_path) as c:
        initialize(c)
        c.send_raw(b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"AID.ECHO.v1",'
                   b'"arguments":{"s":"\\u0001","t":"plain"}}}')
        assert c.answer(2)["result"]["structuredContent"] == {"s": "\u0001", "t": "plain"}
        refused = {
            3: (b'{"big":9.9e308}', "invalid JSON at byte 14: number overflow parsing '9.9e308'"),
            4: (b'{"k":"\xff"}', "invalid JSON at byte 7: syntax error while parsing value - invalid string: "
                              "ill-formed UTF-8 byte"),
            5: (b'{"\xc3\x28":1}', "invalid JSON at byte 4: syntax error while parsing object key - invalid "
                                "string: ill-formed UTF-8 byte"),
            6: (b'{"lone":"\\udc00"}', "invalid JSON at byte 15: syntax error while parsing value - invalid "
                                    "string: surrogate U+DC00..U+DFFF must follow U+D800..U+DBFF"),
        }
        # Text given as _meta's machina/input_json replaces the arguments: the host checks it,
        # however plain the arguments were.
        refused[7] = (b'{}, "_meta": {"machina/input_json": "{not json"}',
                      "invalid JSON at byte 3: syntax error while parsing object key - invalid literal")
        for id, (arguments, why) in refused.items():
            c.send_raw(b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"AID.ECHO.v1",'
                       b'"arguments":%s}}' % (id, arguments))
            result = c.answer(id)["result"]
            assert result["isError"] is True
            assert result["_meta"]["machina/code"] == "invalid_input"
            assert result["content"][0]["text"] == "input_json is not valid JSON: " + why
        assert c.close() == 0


def test_the_data_of_an_error_names_the_hosts_status_and_code(tmp_path: Path) -> None:
    with mcp_client(tmp_path) as c:
        answer = c.answer(call(c, "AID.NOPE.v1", {}))
        assert answer["error"] == {"code": -32602, "message": "tool not found: AID.NOPE.v1",
                                   "data": {"status": "INVALID_PICK", "code": "tool_not_found"}}
        answer = c.answer(call(c, "AID.ECHO.v1", meta={"machina/ds_state": {"slots": 5}}))
        assert answer["error"]["data"]["code"] == "invalid_ds_state"


def test_tools_list_pages(tmp_path: Path) -> None:
    with mcp_client(tmp_path, "--mcp-page-size", "3") as c:
        names, cursor, pages = [], None, 0
        while True:
            result = c.result("tools/list", {"cursor": cursor} if cursor else {})
            names += [t["name"] for t in result["tools"]]
            pages += 1
            cursor = result.get("nextCursor")
            if cursor is None:
                break
        listed = json.loads(subprocess.run([TOOLHOST, "--list"], capture_output=True, timeout=60).stdout)["tools"]
        # Another name of a tool (a pack tool's service names) is not shown to a model twice.
        primary = [t["aid"] for t in listed if "alias_of" not in t]
        assert len(primary) < len(listed) and "readFile" not in names
        assert names == primary and pages == -(-len(primary) // 3)


def test_meta_carries_idempotency_keys_leases_deadlines_traces_and_state(tmp_path: Path, mixed: Path) -> None:
    env = {"MACHINA_LEASE_ENFORCE": "1", "MACHINA_LEASE_SECRET": LEASE_SECRET,
           "MACHINA_LEASE_LEDGER": str(tmp_path / "ledger"), "MACHINA_TOOLHOST_WORKSPACE": str(tmp_path)}
    with mcp_client(tmp_path, "--tools", str(mixed), **env) as c:
        first = c.answer(call(c, ECHO, {"n": 1}, {"machina/idempotency_key": "k1"}))["result"]
        again = c.answer(call(c, ECHO, {"n": 1}, {"machina/idempotency_key": "k1"}))["result"]
        assert "_meta" not in first and again["_meta"] == {"machina/idempotent_hit": True}
        conflict = c.answer(call(c, ECHO, {"n": 2}, {"machina/idempotency_key": "k1"}))["result"]
        assert conflict["isError"] and conflict["_meta"]["machina/code"] == "idempotency_conflict"

        write = {"path": "a.txt", "content": "x"}
        refused = c.answer(call(c, "AID.FILE.WRITE.v1", write))["result"]
        assert refused["isError"] and refused["_meta"] == {"machina/status": "TOOL_ERROR",
                                                           "machina/code": "lease_required", "machina/tier": 1,
                                                           "machina/aid": "AID.FILE.WRITE.v1"}
        lease = md.issue_lease("AID.FILE.WRITE.v1", 60, LEASE_SECRET)
        done = c.answer(call(c, "AID.FILE.WRITE.v1", write, {"machina/lease_token": lease}))["result"]
        assert not done["isError"] and (tmp_path / "a.txt").read_text() == "x"

        t0 = time.monotonic()
        late = c.answer(call(c, "AID.PY.SLEEP.v1", {"s": PAST_GUARD_MS / 1000}, {"machina/timeout_ms": 300}))["result"]
        assert late["_meta"]["machina/code"] == "timeout" and 0.3 <= time.monotonic() - t0 < scaled(HANG_GUARD_S)

        traced = c.answer(call(c, "AID.PY.GREET.v1", {"name": "x"}, {"machina/trace_id": "trace-42"}))["result"]
        assert traced["_meta"]["machina/trace"]["trace_id"] == "trace-42"

        state = {"slots": {"DS0": {"type": "t", "content_json": "1"}}}
        put = c.answer(call(c, "AID.STATE.PUT.v1", {"slot": 2, "type": "n", "content": 7},
                            {"machina/ds_state": state}))["result"]
        assert put["_meta"]["machina/ds_state"]["slots"]["DS2"]["content_json"] == "7"
        raw = c.answer(call(c, ECHO, meta={"machina/input_json": "  [1, 2] "}))["result"]
        assert raw["content"][0]["text"] == "  [1, 2] " and "structuredContent" not in raw


def test_requests_on_one_stdin_run_at_once(mixed: Path, tmp_path: Path) -> None:
    with mcp_client(tmp_path, "--tools", str(mixed)) as c:
        c.answer(call(c, "AID.SKILL.PROBE.SLEEP.v1", {"ms": 1}))
        ids = [call(c, "AID.SKILL.PROBE.SLEEP.v1", {"ms": 1000, "stamps": True}) for _ in range(8)]
        fast = call(c, ECHO, {"quick": True})
        assert c.answer(fast)["result"]["structuredContent"] == {"quick": True}
        assert not [i for i in ids if c.has_answer(i)]  # not behind the sleepers
        sleepers = [c.answer(i)["result"] for i in ids]
        assert most_at_once(r["structuredContent"] for r in sleepers) >= 2, sleepers  # not one after another


def test_a_request_behind_a_long_call_is_read_after_a_run_of_quick_calls(mixed: Path, tmp_path: Path) -> None:
    # Quick calls in lock-step for a while: the standby finds nothing to take over and looks
    # less often (up to every 8 ms); it must still take the reading over from a long call.
    with mcp_client(tmp_path, "--tools", str(mixed)) as c:
        start = time.monotonic()
        n = 0
        while time.monotonic() - start < 0.3:
            assert c.answer(call(c, ECHO, {"n": n}))["result"]["structuredContent"] == {"n": n}
            n += 1
        slow = call(c, "AID.SKILL.PROBE.SLEEP.v1", {"ms": 1500})
        fast = call(c, ECHO, {"quick": True})
        assert c.answer(fast)["result"]["structuredContent"] == {"quick": True}
        assert not c.has_answer(slow)  # read while the long call runs, not after it
        assert c.answer(slow)["result"]["content"][0]["text"] == "slept"


def test_a_cancelled_call_is_stopped_and_never_answered(mixed: Path, tmp_path: Path) -> None:
    skill = tmp_path / "probe"
    started = tmp_path / "started"
    with mcp_client(tmp_path, "--tools", str(mixed), CANCEL_LOG=str(tmp_path / "cancelled.log")) as c:
        initialize(c)  # (serving: a call sent now starts at once)
        # A skill's call: the skill is told.
        s = call(c, "AID.SKILL.PROBE.SLEEP.v1", {"ms": 5000})
        time.sleep(0.3)
        c.send("notifications/cancelled", {"requestId": s, "reason": "the user gave up"}, notify=True)
        told = wait_for(lambda: [e for e in probe_log(skill) if e["event"] == "notifications/cancelled"],
                        what="the skill to be told")
        assert told[0]["params"]["reason"] == "cancelled by its caller"
        # A Python tool's call: its worker (the one worker, whose pid a first call shows) is killed.
        worker = c.answer(call(c, "AID.PY.GREET.v1", {"name": "x"}))["result"]["_meta"]["machina/trace"]["worker_pid"]
        p = call(c, "AID.PY.SLEEP.v1", {"s": 30, "started": str(started)})
        wait_for(started.exists, what="the Python call to start")
        c.send("notifications/cancelled", {"requestId": p}, notify=True)
        wait_for(lambda: not alive(worker), what="the Python worker to be killed")
        again = c.answer(call(c, "AID.PY.GREET.v1", {"name": "y"}))["result"]["_meta"]["machina/trace"]["worker_pid"]
        assert again != worker
        # A hosted MCP server's call: the server cancels its handler.
        m = call(c, "AID.MCP.SDK.SLOW.v1", {"seconds": 30})
        time.sleep(0.5)
        c.send("notifications/cancelled", {"requestId": m}, notify=True)
        wait_for(lambda: (tmp_path / "cancelled.log").exists(), what="the server to cancel its handler")
        # None of them is answered; everything else still is.
        assert c.answer(call(c, ECHO, {"after": 1}))["result"]["structuredContent"] == {"after": 1}
        time.sleep(0.3)
        assert not any(c.has_answer(i) for i in (s, p, m))
        assert c.close() == 0


def test_a_cancelled_isolated_plugin_call_is_killed(tmp_path: Path, misbehaving: str) -> None:
    with mcp_client(tmp_path, "--isolation", "process", "--isolation-workers", "1", "--plugin", misbehaving,
                    "--plugin", str(md.builtin_plugin_path())) as c:
        i = call(c, "AID.TEST.HANG.v1", {}, {"machina/timeout_ms": PAST_GUARD_MS})
        time.sleep(0.5)
        t0 = time.monotonic()
        c.send("notifications/cancelled", {"requestId": i}, notify=True)
        # The worker is free again at once: the next call does not wait for a deadline.
        assert c.answer(call(c, ECHO, {"x": 1}))["result"]["structuredContent"] == {"x": 1}
        assert c.answer(call(c, "AID.TEST.HANG.v1", {}, {"machina/timeout_ms": 200}))["result"]["isError"]
        assert time.monotonic() - t0 < scaled(5) and not c.has_answer(i)  # (not its deadline)


def test_a_line_too_large_is_answered_with_its_id(tmp_path: Path) -> None:
    with mcp_client(tmp_path, "--max-request-bytes", "1000") as c:
        c.send_raw(json.dumps({"jsonrpc": "2.0", "id": 77, "method": "tools/call",
                               "params": {"name": ECHO, "arguments": {"x": "y" * 5000}}}))
        answer = c.answer(77)
        assert answer["error"]["code"] == -32600 and answer["error"]["data"]["code"] == "request_too_large"
        assert c.result("ping") == {}


def test_lock_step_with_one_worker(tmp_path: Path) -> None:
    with mcp_client(tmp_path, "--workers", "1") as c:
        initialize(c)
        for n in range(20):
            assert c.answer(call(c, ECHO, {"n": n}))["result"]["structuredContent"] == {"n": n}
        assert c.close() == 0


# --- the protocol transcripts through --mcp ------------------------------------------------------------------

META = {"idempotency_key": "machina/idempotency_key", "_lease_token": "machina/lease_token",
        "timeout_ms": "machina/timeout_ms", "trace_id": "machina/trace_id", "ds_state": "machina/ds_state",
        "input_json": "machina/input_json"}
REQUEST_ERRORS = {"malformed_request", "invalid_ds_state", "tool_not_found", "request_too_large"}


class Pairs(list):  # type: ignore[type-arg]
    """A JSON object's members in order, duplicates kept."""


def as_mcp(line: str, n: int) -> tuple[str, Any]:
    """A transcript's request line as an MCP tools/call line, and the JSON-RPC id it carries.
    A field given twice stays given twice."""
    try:
        request = json.loads(line, object_pairs_hook=Pairs)
    except ValueError:
        return line, None  # not JSON either way

    def text(v: Any) -> str:
        if isinstance(v, Pairs):
            return "{" + ", ".join(f"{json.dumps(k)}: {text(x)}" for k, x in v) + "}"
        if isinstance(v, list):
            return "[" + ", ".join(text(x) for x in v) + "]"
        return json.dumps(v)

    rid: Any = f"r{n}"
    if not isinstance(request, Pairs):
        return text(Pairs([("jsonrpc", "2.0"), ("id", rid), ("method", "tools/call"), ("params", request)])), rid
    params = Pairs(("name", v) for k, v in request if k == "aid")
    meta = Pairs((META[k], v) for k, v in request if k in META)
    if meta:
        params.append(("_meta", meta))
    ids = [v for k, v in request if k == "id"]
    if ids:
        rid = ids[-1]
        if not (isinstance(rid, (str, int)) and not isinstance(rid, bool)):
            rid = None  # not an id this front takes: answered with a null id
    message = Pairs([("jsonrpc", "2.0"), *(("id", i) for i in (ids or [f"r{n}"])), ("method", "tools/call"),
                     ("params", params)])
    return text(message), rid


def assert_equivalent(answer: dict[str, Any], want: dict[str, Any], label: str) -> None:
    """An MCP answer says what the NDJSON response says."""
    if "id" in want:
        assert answer["id"] == want["id"], label
    if "error" in answer:
        data = answer["error"]["data"]
        assert want["ok"] is False and want["code"] in REQUEST_ERRORS, label
        assert (data["status"], data["code"]) == (want["status"], want["code"]), label
        message = answer["error"]["message"]
        if want["error"].startswith("malformed request:"):
            # (The MCP front's own checks name MCP's fields: params.name for aid, ...)
            assert message.startswith(("malformed request:", "Parse error", "Invalid Request")), (label, message)
        else:
            assert message == want["error"], label
        return
    result = answer["result"]
    meta = result.get("_meta", {})
    text = result["content"][0]["text"]
    assert result["isError"] is (not want["ok"]), label
    if want["ok"]:
        # The output's JSON text; a string output's own text.
        out = want["output_json"]
        shown = json.loads(out) if out.startswith('"') else out
        assert text == shown and want["error"] == "", label
        if text.lstrip().startswith("{"):
            assert result["structuredContent"] == json.loads(text), label
    else:
        said = (meta["machina/status"], meta["machina/code"], text)
        assert said == (want["status"], want["code"], want["error"]), label
        for key in ("tier", "aid", "reason"):
            assert meta.get(f"machina/{key}") == want.get(key), label
    if "ds_state" in want:
        empty = {"delta": True, "slots": {}, "removed_slots": []}
        assert meta.get("machina/ds_state", empty) == want["ds_state"], label
    assert meta.get("machina/idempotent_hit", False) == want.get("idempotent_hit", False), label


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem) for p in TRANSCRIPT_FILES])
def test_transcripts_replay_through_the_mcp_front(path: Path, test_plugins: dict[str, str], tmp_path: Path) -> None:
    transcript = load_transcript(path)
    args = ["--workers", "1", *transcript.args]  # (in order: the transcripts' steps build on each other)
    if transcript.plugins is not None:
        for p in [str(md.builtin_plugin_path()), *(test_plugins[name] for name in transcript.plugins)]:
            args += ["--plugin", p]
        args += ["--packs", "files,shell"]
    env = transcript.environment(tmp_path / "ledger")
    steps = [s for s in transcript.steps if not s.blank]
    with mcp_client(tmp_path, *args, **env) as c:
        for n, step in enumerate(steps):
            line, rid = as_mcp(step.line, n)
            c.send_raw(line)
            answer = c.answer(rid)
            assert step.expected is not None
            assert_equivalent(answer, step.expected, f"{transcript.name}:{step.number} {step.line[:100]!r}")
        assert c.close() == 0


def test_asyncio_clients_in_flight_together(mixed: Path, tmp_path: Path) -> None:
    """Many SDK calls at once over one pipe (the SDK's client sends them without waiting)."""
    async def session() -> list[Any]:
        params = StdioServerParameters(command=TOOLHOST, args=["--mcp", "--tools", str(mixed)],
                                       env={"XDG_STATE_HOME": str(tmp_path / "state")})
        async with Client(params, read_timeout_seconds=60) as client:
            await client.list_tools()
            results = await asyncio.gather(*(client.call_tool("AID.SKILL.PROBE.SLEEP.v1", {"ms": 300, "stamps": True})
                                             for _ in range(10)))
            assert all(not r.is_error for r in results)
            return [r.structured_content for r in results]

    assert most_at_once(asyncio.run(session())) >= 2  # in flight together, not one at a time
