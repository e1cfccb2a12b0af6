"""The NATS transport (machina_dispatch.Nats) against machina-toolhost --nats hosts on a real
nats-server: results and errors as the other transports give them, the client's window
under a host's pending cap, and the front's command-line errors. The checks of the message
forms and of discovery that tests/test_nats_native.py runs live here too."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import machina_dispatch as md
import nats
import pytest
from conftest import PAST_GUARD_S, TOOLHOST, scaled
from machina_dispatch.nats_client import Nats
from nats.micro.service import ServiceInfo, ServicePing, ServiceStats
from nats_support import Front, nats_server
from python_support import python_tool, write_pack


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with nats_server() as u:
        yield u


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("hello\n")
    (ws / ".env").write_text("SECRET=1\n")
    return ws


def request(url: str, subject: str, body: bytes | dict[str, Any], headers: dict[str, str] | None = None,
            timeout: float = 10) -> tuple[Any, dict[str, str]]:
    """One raw NATS request with nats-py: the decoded body and the headers."""
    async def go() -> tuple[Any, dict[str, str]]:
        nc = await nats.connect(url)
        try:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            msg = await nc.request(subject, data, timeout=timeout, headers=headers)
            return json.loads(msg.data), dict(msg.headers or {})
        finally:
            await nc.close()
    return asyncio.run(go())


def check_message_forms(url: str, prefix: str, workspace: Path) -> None:
    """The message forms of a front serving `prefix` with the default tools on `workspace`
    (holding notes.txt and .env as the fixture makes them)."""
    # The tool's own input -> {data, error}.
    assert request(url, "tools.file.read", {"path": "notes.txt"}) == ({"data": "hello\n", "error": None}, {})
    body, headers = request(url, "tools.file.read", {"path": "/etc/passwd"})
    assert body["data"] is None and body["error"].startswith("AccessDenied: /etc/passwd")
    assert headers["Nats-Service-Error-Code"] == "403" and headers["Machina-Error-Code"] == "access_denied"
    assert headers["Nats-Service-Error"] == body["error"]
    body, headers = request(url, "tools.file.read", {"path": ".env"})
    assert body["error"].startswith("AccessDenied") and "SECRET" not in json.dumps(body)
    body, _ = request(url, "tools.file.write", {"path": "new.txt", "content": "written over NATS"})
    assert body == {"data": {"bytes_written": 17}, "error": None}
    assert (workspace / "new.txt").read_text() == "written over NATS"
    body, _ = request(url, "tools.file.list", {"path": ".", "pattern": "*.txt"})
    assert sorted(e["path"] for e in body["data"]) == ["new.txt", "notes.txt"] and body["error"] is None
    body, headers = request(url, "tools.file.read", {"path": "missing.txt"})
    assert body["error"].startswith("NotFound") and headers["Nats-Service-Error-Code"] == "404"
    body, headers = request(url, "tools.shell.exec", {"command": "rm", "args": ["-rf", "/"]})
    assert body["data"] is None and body["error"].startswith("AccessDenied")
    # The OpenAI call form, on a tools.* subject -> the tool message.
    call: dict[str, Any] = {"tool_call_id": "call_abc123",
            "function": {"name": "readFile", "arguments": json.dumps({"path": "notes.txt"})}}
    assert request(url, "tools.file.read", call) == (
        {"tool_call_id": "call_abc123", "role": "tool", "name": "readFile", "content": "hello\n"}, {})
    call["function"]["arguments"] = json.dumps({"path": "/etc/shadow"})
    body, headers = request(url, "tools.file.read", call)
    assert body["content"].startswith("Error: AccessDenied") and headers["Nats-Service-Error-Code"] == "403"
    # A function that is not the subject's tool is refused, and nothing is written.
    wrong = {"tool_call_id": "call_x", "function": {"name": "writeFile",
                                                    "arguments": json.dumps({"path": "w.txt", "content": "x"})}}
    body, headers = request(url, "tools.file.read", wrong)
    assert "not the tool of subject" in body["content"] and headers["Nats-Service-Error-Code"] == "400"
    assert not (workspace / "w.txt").exists()
    # Our envelope, on the call subject and on a tool's own subject.
    body, headers = request(url, f"{prefix}.call", {"id": 7, "aid": "AID.ECHO.v1", "input_json": "[1, 2]"})
    assert body["id"] == 7 and body["ok"] is True and body["output_json"] == "[1, 2]" and headers == {}
    body, _ = request(url, f"{prefix}.tool.AID.ECHO.v1", {"aid": "AID.ECHO.v1", "input_json": "{}"})
    assert body["ok"] is True
    body, _ = request(url, f"{prefix}.tool.AID.ECHO.v1", {"aid": "AID.TEXT.STATS.v1", "input_json": "{}"})
    assert body["code"] == "malformed_request" and "names aid" in body["error"]
    # A tool's own subject also takes its raw input.
    assert request(url, f"{prefix}.tool.AID.ECHO.v1", {"x": 1}) == ({"data": {"x": 1}, "error": None}, {})
    # An OpenAI call on the call subject, under the name the LLM formats give the aid.
    from machina_dispatch.llm import tool_name
    body, _ = request(url, f"{prefix}.call", {"tool_call_id": "call_1", "function": {
        "name": tool_name("AID.ECHO.v1"), "arguments": '{"k": "v"}'}})
    assert body == {"tool_call_id": "call_1", "role": "tool", "name": tool_name("AID.ECHO.v1"),
                    "content": '{"k": "v"}'}
    # Bad input: a structured error, and the host keeps serving.
    for bad in (b"not json", b"[1, 2]", b'{"aid": 5}', b'{"aid": "AID.NOPE.v1"}'):
        body, headers = request(url, f"{prefix}.call", bad)
        assert body["ok"] is False and body["status"] == "INVALID_PICK", bad
        assert headers["Nats-Service-Error-Code"] in ("400", "404") and headers["Nats-Service-Error"]
    body, headers = request(url, "tools.file.read", b"{broken")
    assert body["data"] is None and body["error"].startswith("InvalidInput")
    assert request(url, f"{prefix}.tool.AID.ECHO.v1", {"still": "serving"})[0]["data"] == {"still": "serving"}


def check_discovery(url: str, prefix: str, front: Front) -> None:
    """Discovery, per-endpoint stats and the tool list of a fresh front serving `prefix`."""
    for i in range(3):
        request(url, f"{prefix}.tool.AID.ECHO.v1", {"i": i})
    request(url, f"{prefix}.call", {"aid": "AID.NOPE.v1"})
    sid = front.service_id
    for subject in ("$SRV.PING", "$SRV.PING.machina-toolhost", f"$SRV.PING.machina-toolhost.{sid}"):
        ping = ServicePing.from_dict(request(url, subject, b"")[0])
        assert ping.name == "machina-toolhost" and ping.id == sid
    info = ServiceInfo.from_dict(request(url, f"$SRV.INFO.machina-toolhost.{sid}", b"")[0])
    subjects = {e.subject: e for e in info.endpoints}
    assert {f"{prefix}.call", f"{prefix}.tools", f"{prefix}.tool.AID.ECHO.v1", "tools.file.read",
            "tools.shell.exec", "tools.code.grep"} <= set(subjects)
    assert all(e.queue_group == "q" for e in info.endpoints)
    assert subjects[f"{prefix}.tool.AID.FILE.READ.v1"].metadata == {"aid": "AID.FILE.READ.v1"}
    assert f"{prefix}.tool.readFile" not in subjects  # aliases: their tools.* subject, or the call subject
    stats = ServiceStats.from_dict(request(url, f"$SRV.STATS.machina-toolhost.{sid}", b"")[0])
    by_subject = {e.subject: e for e in stats.endpoints}
    echo = by_subject[f"{prefix}.tool.AID.ECHO.v1"]
    assert (echo.num_requests, echo.num_errors) == (3, 0) and echo.processing_time > 0
    assert echo.average_processing_time == echo.processing_time // 3
    call = by_subject[f"{prefix}.call"]
    assert (call.num_requests, call.num_errors) == (1, 1) and "AID.NOPE.v1" in (call.last_error or "")
    # The tool list, as --list prints it.
    listed = request(url, f"{prefix}.tools", b"")[0]
    expected = json.loads(subprocess.run([TOOLHOST, "--list"], capture_output=True, check=True).stdout)
    assert sorted(t["aid"] for t in listed) == sorted(t["aid"] for t in expected["tools"])


def test_transport_api_results_and_errors(url: str, workspace: Path, tmp_path: Path) -> None:
    prefix = "api"
    with Front(url, ["--nats-prefix", prefix], env={"MACHINA_TOOLHOST_WORKSPACE": str(workspace)},
               log_dir=tmp_path), Nats(url, prefix=prefix, timeout=10) as t:
        assert t.call("AID.ECHO.v1", {"a": 1}).output_json == '{"a":1}'
        with pytest.raises(md.ToolNotFound):
            t.call("AID.NOPE.v1")
        with pytest.raises(md.AccessDenied):
            t.call("tools.file.read", {"path": "/etc/passwd"})
        assert t.call("readFile", {"path": "notes.txt"}).output_json == '"hello\\n"'
        with pytest.raises(md.InvalidInput):
            t.call("AID.ECHO.v1", {1, 2})  # refused before sending
        big = t.call("AID.ECHO.v1", "x" * (2 * 1024 * 1024), check=False)  # over the server's 1 MiB max_payload
        assert big.kind == "request_too_large" and big.status == "INVALID_PICK" and "max_payload" in big.error
        state = md.DsState()
        t.call("AID.STATE.PUT.v1", {"slot": 3, "type": "t", "content": "x"}, state=state)
        assert state[3].type == "t" and state[3].content == "x"
        first = t.call("AID.ECHO.v1", {"k": 1}, idempotency_key="key-1")
        again = t.call("AID.ECHO.v1", {"k": 1}, idempotency_key="key-1")
        assert not first.idempotent_hit and again.idempotent_hit and again.output_json == first.output_json
        results = t.call_many([("AID.ECHO.v1", {"i": i}) for i in range(50)] + [("AID.NOPE.v1",)], check=False)
        assert [r.ok for r in results] == [True] * 50 + [False] and results[-1].kind == "tool_not_found"

        async def many() -> list[md.ToolResult]:
            return list(await asyncio.gather(*(t.acall("AID.ECHO.v1", [i]) for i in range(100))))
        assert [r.output_json for r in asyncio.run(many())] == [f"[{i}]" for i in range(100)]
        listed = json.loads(subprocess.run([TOOLHOST, "--list"], capture_output=True, check=True).stdout)["tools"]
        assert [tool["aid"] for tool in t.list_tools()] == [tool["aid"] for tool in listed]  # as --list lists them
    # Nobody serves the subject: an answer at once, not a hang.
    with Nats(url, prefix="nobody", timeout=PAST_GUARD_S) as t:
        start = time.monotonic()
        r = t.call("AID.ECHO.v1", check=False)
        assert r.kind == "service_unavailable" and "host serves nobody.call" in r.error
        assert time.monotonic() - start < scaled(2)  # not the client's timeout (the message says which path answered)
        with pytest.raises(md.ServiceError):
            t.call("AID.ECHO.v1")
    # Durable calls and no stream to take them: an answer at once, naming the stream.
    with Nats(url, prefix="no-stream-here", durable=True, timeout=2) as t:
        r = t.call("AID.ECHO.v1", check=False)
        assert r.kind == "service_unavailable" and "stream" in r.error
    with pytest.raises(md.HostError, match="cannot connect to NATS"):
        Nats("nats://127.0.0.1:1")


def marker_pack(tmp_path: Path) -> Path:
    return write_pack(tmp_path / "pack", [python_tool("AID.PY.MARK.v1", "tools.sample_tool:sleep")])


def test_the_client_window_keeps_a_big_batch_within_the_hosts_pending_cap(url: str, tmp_path: Path) -> None:
    """A batch far larger than the host's --nats-max-pending loses nothing when the client's
    window is below that cap; a window that is not a positive integer is refused."""
    prefix = "win"
    with Front(url, ["--nats-prefix", prefix, "--nats-max-pending", "64", "--packs", "none"], log_dir=tmp_path), \
            Nats(url, prefix=prefix, timeout=10, max_in_flight=32) as t:
        results = asyncio.run(t.acall_many([("AID.ECHO.v1", {"i": i}) for i in range(3000)]))
        assert [json.loads(r.output_json)["i"] for r in results] == list(range(3000))
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_in_flight"):
            Nats(url, max_in_flight=bad)  # type: ignore[arg-type]




def test_cli_errors_and_clean_stop(url: str, tmp_path: Path) -> None:
    """What tests/test_nats_native.py's test_cli_errors leaves out: a bad --workers and a
    plugin that is not there, each refused before serving; SIGTERM answers the call running."""
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([TOOLHOST, "--nats", url, *args], capture_output=True, text=True, timeout=60)
    r = run("--workers", "0")
    assert r.returncode == 2 and "--workers" in r.stderr, r.stderr
    r = run("--plugin", str(tmp_path / "missing.so"))
    assert r.returncode != 0 and "missing.so" in r.stderr, r.stderr
    pack = marker_pack(tmp_path)
    front = Front(url, ["--nats-prefix", "stop", "--tools", str(pack), "--packs", "none"], log_dir=tmp_path)
    with Nats(url, prefix="stop", timeout=10) as t:
        fut = t._submit("AID.PY.MARK.v1", {"s": 1.0}, None, None, None, None, False)
        time.sleep(0.4)
        assert front.stop() == 0, front.stderr()
        assert fut.result(10).ok
