"""The NATS front (machina-toolhost-nats) and the NATS transport, against a real nats-server:
message forms, discovery, queue groups, a host killed with SIGKILL under load, and the
durable (JetStream) mode with hosts that die between running a tool and acknowledging."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import machina_dispatch as md
import nats
import pytest
from conftest import TOOLHOST
from machina_dispatch.nats_client import Nats
from nats.micro.service import ServiceInfo, ServicePing, ServiceStats
from nats_support import Front, front_binary, nats_server
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


def test_seed_subjects_raw_fields_and_openai_calls(url: str, workspace: Path, tmp_path: Path) -> None:
    prefix = "seedtest"
    with Front(url, ["--prefix", prefix], env={"MACHINA_TOOLHOST_WORKSPACE": str(workspace)}, log_dir=tmp_path):
        check_message_forms(url, prefix, workspace)


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
    call = {"tool_call_id": "call_abc123",
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


def test_discovery_and_per_endpoint_stats(url: str, tmp_path: Path) -> None:
    prefix = "disco"
    with Front(url, ["--prefix", prefix], log_dir=tmp_path) as front:
        check_discovery(url, prefix, front)


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


def test_a_slow_tool_delays_nothing_else(url: str, misbehaving: str, tmp_path: Path) -> None:
    prefix = "slow"
    with Front(url, ["--prefix", prefix, "--plugin", misbehaving, "--plugin", str(md.builtin_plugin_path())],
               log_dir=tmp_path) as front, Nats(url, prefix=prefix) as t:
        async def go() -> tuple[float, md.ToolResult]:
            hang = asyncio.ensure_future(t.acall("AID.TEST.HANG.v1", timeout=3, check=False))
            await asyncio.sleep(0.2)
            start = time.monotonic()
            results = await t.acall_many([("AID.ECHO.v1", {"i": i}) for i in range(200)])
            elapsed = time.monotonic() - start
            assert [json.loads(r.output_json) for r in results] == [{"i": i} for i in range(200)]
            return elapsed, await hang
        elapsed, hang = asyncio.run(go())
        assert elapsed < 2.0, f"200 echo calls took {elapsed:.2f} s beside a hanging call"
        assert hang.kind == "timeout"
        # SIGTERM: the front does not wait for the thread still in the hanging tool.
        started = time.monotonic()
        assert front.stop(timeout=10) == 0 and time.monotonic() - started < 5
        assert "exiting with 1 call(s) still stuck in tools past their deadline" in front.stderr()


def test_transport_api_results_and_errors(url: str, workspace: Path, tmp_path: Path) -> None:
    prefix = "api"
    with Front(url, ["--prefix", prefix], env={"MACHINA_TOOLHOST_WORKSPACE": str(workspace)}, log_dir=tmp_path), \
            Nats(url, prefix=prefix, timeout=10) as t:
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
        assert [tool["aid"] for tool in t.list_tools()][:2] == ["AID.ECHO.v1", "AID.TEXT.STATS.v1"]
    # Nobody serves the subject: an answer at once, not a hang.
    with Nats(url, prefix="nobody", timeout=5) as t:
        start = time.monotonic()
        r = t.call("AID.ECHO.v1", check=False)
        assert r.kind == "service_unavailable" and "no machina-toolhost-nats host" in r.error
        assert time.monotonic() - start < 2
        with pytest.raises(md.ServiceError):
            t.call("AID.ECHO.v1")
    with pytest.raises(md.HostError, match="cannot connect to NATS"):
        Nats("nats://127.0.0.1:1")


def test_queue_group_shares_the_load(url: str, tmp_path: Path) -> None:
    prefix = "group"
    with Front(url, ["--prefix", prefix], log_dir=tmp_path) as a, Front(url, ["--prefix", prefix],
                                                                          log_dir=tmp_path) as b, \
            Nats(url, prefix=prefix) as t:
        t.call_many([("AID.ECHO.v1", {"i": i}) for i in range(400)])
        served = {}
        for front in (a, b):
            stats = request(url, f"$SRV.STATS.machina-toolhost.{front.service_id}", b"")[0]
            served[front.service_id] = sum(e["num_requests"] for e in stats["endpoints"])
        assert sum(served.values()) == 400 and min(served.values()) > 0, served


def marker_pack(tmp_path: Path) -> Path:
    return write_pack(tmp_path / "pack", [python_tool("AID.PY.MARK.v1", "tools.sample_tool:sleep")])


def runs(marks: Path, key: str) -> int:
    path = marks / key
    return path.read_text().count("ran\n") if path.exists() else 0


def test_sigkill_under_load_answers_every_call_and_never_runs_a_key_twice(url: str, tmp_path: Path) -> None:
    """3 hosts in one queue group, 2 000 calls with idempotency keys; one host is killed
    with SIGKILL mid-load. Every call ends with exactly one final answer; retries with the
    same key never run the tool a second time."""
    prefix = "scale"
    pack = marker_pack(tmp_path)
    marks = tmp_path / "marks"
    marks.mkdir()
    args = ["--prefix", prefix, "--tools", str(pack), "--packs", "none", "--idempotency", "kv",
            "--kv-bucket", "scale_idem", "--claim-grace-ms", "1000", "--concurrency", "16"]
    fronts = [Front(url, args, log_dir=tmp_path) for _ in range(3)]
    total = 2000
    try:
        with Nats(url, prefix=prefix, timeout=2) as t:
            async def one(i: int, answered: list[int]) -> tuple[md.ToolResult, int]:
                payload = {"s": 0.002, "mark": str(marks / f"k{i}")}
                tries = 0
                while True:
                    tries += 1
                    r = await t.acall("AID.PY.MARK.v1", payload, idempotency_key=f"k{i}", check=False)
                    if r.kind != "service_unavailable" or tries == 10:
                        answered.append(i)
                        return r, tries

            async def load() -> list[tuple[md.ToolResult, int]]:
                answered: list[int] = []
                tasks = [asyncio.ensure_future(one(i, answered)) for i in range(total)]
                while len(answered) < total // 4:
                    await asyncio.sleep(0.01)
                fronts[0].kill()  # SIGKILL, calls in flight on it
                return list(await asyncio.gather(*tasks))
            outcomes = asyncio.run(load())
    finally:
        for f in fronts[1:]:
            assert f.stop() == 0, f.stderr()
    assert len(outcomes) == total
    kinds: dict[str | None, int] = {}
    for i, (r, _) in enumerate(outcomes):
        kinds[r.code] = kinds.get(r.code, 0) + 1
        n = runs(marks, f"k{i}")
        assert n <= 1, f"k{i} ran {n} times"
        if r.ok:
            assert n == 1
        else:
            # The only failure: a host took the key and died before storing the answer.
            assert r.code == "tool_crashed" and "whether the tool ran is unknown" in r.error, r
    retried = sum(1 for _, tries in outcomes if tries > 1)
    assert kinds.get(None, 0) >= total - 16, kinds  # at most one host's concurrency is in doubt
    assert retried > 0, "the killed host held no call in flight: the test did not test anything"


async def die_then_recover(t: Nats, dying: Front, status: int, url: str, args: list[str], tmp_path: Path,
                           marks: Path) -> md.ToolResult:
    """One durable call; the first host dies (fault injection) with `status` after running
    the tool; then a second host starts, gets the call again, and answers it."""
    call = asyncio.ensure_future(t.acall("AID.PY.MARK.v1", {"s": 0.01, "mark": str(marks / "once")}, check=False))
    deadline = time.monotonic() + 20
    while dying.proc.poll() is None and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert dying.proc.returncode == status, dying.stderr()
    assert runs(marks, "once") == 1 and not call.done()
    second = await asyncio.to_thread(Front, url, args, None, tmp_path)
    try:
        return await asyncio.wait_for(call, 30)
    finally:
        assert second.stop() == 0, second.stderr()


def test_durable_host_killed_after_running_before_acking(url: str, tmp_path: Path) -> None:
    """Durable mode: the first host runs the tool, stores the answer and dies before it
    answers or acks; the stream delivers the call again to a second host, which replays the
    stored answer: one answer, one run."""
    prefix = "durable1"
    pack = marker_pack(tmp_path)
    marks = tmp_path / "marks"
    marks.mkdir()
    args = ["--prefix", prefix, "--tools", str(pack), "--packs", "none", "--durable", "--stream", "D1",
            "--kv-bucket", "d1_idem", "--ack-wait-s", "1"]
    dying = Front(url, args, env={"MACHINA_TOOLHOST_NATS_FAULT": "exit-before-ack"}, log_dir=tmp_path)
    with Nats(url, prefix=prefix, durable=True, timeout=5, redelivery_s=20) as t:
        r = asyncio.run(die_then_recover(t, dying, 71, url, args, tmp_path, marks))
    assert r.ok and r.idempotent_hit, r
    assert runs(marks, "once") == 1


def test_durable_host_killed_before_storing_the_answer(url: str, tmp_path: Path) -> None:
    """The first host dies after the tool ran but before its answer was stored: the second
    one must not run it again — it answers that the outcome is unknown."""
    prefix = "durable2"
    pack = marker_pack(tmp_path)
    marks = tmp_path / "marks"
    marks.mkdir()
    args = ["--prefix", prefix, "--tools", str(pack), "--packs", "none", "--durable", "--stream", "D2",
            "--kv-bucket", "d2_idem", "--ack-wait-s", "1", "--claim-grace-ms", "500"]
    dying = Front(url, args, env={"MACHINA_TOOLHOST_NATS_FAULT": "exit-after-run"}, log_dir=tmp_path)
    with Nats(url, prefix=prefix, durable=True, timeout=2, redelivery_s=20) as t:
        r = asyncio.run(die_then_recover(t, dying, 70, url, args, tmp_path, marks))
    assert not r.ok and r.code == "tool_crashed" and "unknown" in r.error, r
    assert runs(marks, "once") == 1


def test_durable_calls_and_batches(url: str, tmp_path: Path) -> None:
    prefix = "durable3"
    with Front(url, ["--prefix", prefix, "--durable", "--stream", "D3", "--kv-bucket", "d3_idem"], log_dir=tmp_path), \
            Nats(url, prefix=prefix, durable=True, timeout=10) as t:
        assert t.call("AID.ECHO.v1", {"d": 1}).output_json == '{"d":1}'
        results = t.call_many([("AID.ECHO.v1", {"i": i}) for i in range(300)])
        assert [json.loads(r.output_json) for r in results] == [{"i": i} for i in range(300)]
        with pytest.raises(md.ToolNotFound):
            t.call("AID.NOPE.v1")
    with Nats(url, prefix="no-stream-here", durable=True, timeout=2) as t:
        r = t.call("AID.ECHO.v1", check=False)
        assert r.kind == "service_unavailable" and "stream" in r.error


def test_pending_cap_drops_and_the_host_keeps_serving(url: str, misbehaving: str, tmp_path: Path) -> None:
    """--concurrency 1 and --max-pending 4: a flood beyond them is dropped by the server
    (the callers are told no host answered), never buffered without bound."""
    prefix = "cap"
    # (the breaker off: a run of timeouts of the hanging tool would open it, and a slow run,
    # under the sanitizers, answered some calls breaker_open)
    with Front(url, ["--prefix", prefix, "--concurrency", "1", "--max-pending", "4", "--plugin", misbehaving,
                     "--plugin", str(md.builtin_plugin_path()), "--breaker-threshold", "1000000"],
               log_dir=tmp_path) as front, \
            Nats(url, prefix=prefix, timeout=1) as t:
        results = t.call_many([("AID.TEST.HANG.v1", None, None, None, 0.3)] * 30, check=False)
        kinds = [r.kind for r in results]
        assert kinds.count("timeout") >= 1 and kinds.count("service_unavailable") >= 1, kinds
        assert set(kinds) <= {"timeout", "service_unavailable"}
        assert "SlowConsumerError" in front.stderr()
        time.sleep(1.5)
        assert t.call("AID.ECHO.v1", {"after": "flood"}, timeout=5).ok


def test_the_client_window_keeps_a_big_batch_within_the_hosts_pending_cap(url: str, tmp_path: Path) -> None:
    """A batch far larger than the host's --max-pending loses nothing when the client's
    window is below that cap; a window that is not a positive integer is refused."""
    prefix = "win"
    with Front(url, ["--prefix", prefix, "--max-pending", "64", "--packs", "none"], log_dir=tmp_path), \
            Nats(url, prefix=prefix, timeout=10, max_in_flight=32) as t:
        results = asyncio.run(t.acall_many([("AID.ECHO.v1", {"i": i}) for i in range(3000)]))
        assert [json.loads(r.output_json)["i"] for r in results] == list(range(3000))
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_in_flight"):
            Nats(url, max_in_flight=bad)  # type: ignore[arg-type]


def test_cli_errors_and_clean_stop(url: str, tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([front_binary(), *args], capture_output=True, text=True, timeout=60)
    r = run("--url", "nats://127.0.0.1:1")
    assert r.returncode == 1 and "cannot connect to nats://127.0.0.1:1" in r.stderr
    r = run("--url", url, "--concurrency", "0")
    assert r.returncode == 2 and "must be positive" in r.stderr
    r = run("--url", url, "--plugin", str(tmp_path / "missing.so"))
    assert r.returncode == 1 and "missing.so" in r.stderr
    r = run("--help")
    assert r.returncode == 0 and "--durable" in r.stdout and "--max-request-bytes" in r.stdout
    # SIGTERM while a call runs: the call is answered, then the host exits 0.
    pack = marker_pack(tmp_path)
    front = Front(url, ["--prefix", "stop", "--tools", str(pack), "--packs", "none"], log_dir=tmp_path)
    with Nats(url, prefix="stop", timeout=10) as t:
        fut = t._submit("AID.PY.MARK.v1", {"s": 1.0}, None, None, None, None, False)
        time.sleep(0.4)
        assert front.stop() == 0, front.stderr()
        assert fut.result(10).ok
    assert os.path.exists(front.log)


def test_calls_through_nats_are_in_the_audit_store(url: str, workspace: Path, tmp_path: Path) -> None:
    import sqlite3

    store = tmp_path / "audit" / "calls.db"
    store.parent.mkdir()
    front = Front(url, ["--audit-db", str(store), "--packs", "files"],
                  env={"MACHINA_TOOLHOST_WORKSPACE": str(workspace)})
    try:
        with Nats(url) as t:
            assert t.call("AID.FILE.READ.v1", {"path": "notes.txt"}).ok
        data, _ = request(url, "tools.file.read", {"path": ".env"})
        assert data["data"] is None and data["error"].startswith("AccessDenied")
    finally:
        assert front.stop() == 0
    con = sqlite3.connect(store)
    rows = con.execute("SELECT front, tool, code, path FROM call_log ORDER BY id").fetchall()
    con.close()
    assert rows == [("nats", "AID.FILE.READ.v1", "ok", "notes.txt"),
                    ("nats", "tools.file.read", "access_denied", ".env")]
