"""The NATS front in the executable (machina-toolhost --nats) against a real nats-server: the
message forms and discovery as nats.micro reads them, queue groups, the unknown
`tools.*` subject, reply subjects under `$`, deadlines and a clean stop."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import machina_dispatch as md
import nats
import pytest
from conftest import HANG_GUARD_S, TOOLHOST, scaled
from machina_dispatch.nats_client import Nats
from nats_support import Front, nats_server
from test_nats import check_discovery, check_message_forms, request


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with nats_server(jetstream=False) as u:
        yield u


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("hello\n")
    (ws / ".env").write_text("SECRET=1\n")
    return ws


def test_message_forms_subjects_and_error_headers(url: str, workspace: Path, tmp_path: Path) -> None:
    prefix = "nforms"
    with Front(url, ["--prefix", prefix], env={"MACHINA_TOOLHOST_WORKSPACE": str(workspace)}, log_dir=tmp_path):
        check_message_forms(url, prefix, workspace)
        # Call options in headers, for bodies that are not the envelope.
        body, headers = request(url, f"{prefix}.tool.AID.ECHO.v1", {"k": 1}, {"Machina-Timeout-Ms": "soon"})
        assert body["code"] == "malformed_request" and "Machina-Timeout-Ms" in body["error"]
        assert headers["Nats-Service-Error-Code"] == "400"
        first, _ = request(url, f"{prefix}.tool.AID.ECHO.v1", {"k": 2}, {"Idempotency-Key": "nk-1"})
        again, _ = request(url, f"{prefix}.call", {"aid": "AID.ECHO.v1", "input_json": '{"k": 2}',
                                                   "idempotency_key": "nk-1"})
        assert first == {"data": {"k": 2}, "error": None} and again["idempotent_hit"] is True


def test_discovery_stats_and_tool_list_as_nats_micro_reads_them(url: str, tmp_path: Path) -> None:
    prefix = "ndisco"
    with Front(url, ["--prefix", prefix], log_dir=tmp_path) as front:
        check_discovery(url, prefix, front)
        # The tool list, as --list prints its tools (whose `plugin` says "built-in" in the
        # static build, and the plugin's path in the one that serves NATS).
        listed = request(url, f"{prefix}.tools", b"")[0]
        expected = json.loads(subprocess.run([TOOLHOST, "--list"], capture_output=True, check=True).stdout)
        assert [{**t, "plugin": ""} for t in listed] == [{**t, "plugin": ""} for t in expected["tools"]]


def test_the_transport_client_calls_it(url: str, workspace: Path, tmp_path: Path) -> None:
    prefix = "napi"
    with Front(url, ["--prefix", prefix], env={"MACHINA_TOOLHOST_WORKSPACE": str(workspace)}, log_dir=tmp_path), \
            Nats(url, prefix=prefix, timeout=10) as t:
        assert t.call("AID.ECHO.v1", {"a": 1}).output_json == '{"a":1}'
        with pytest.raises(md.ToolNotFound):
            t.call("AID.NOPE.v1")
        with pytest.raises(md.AccessDenied):
            t.call("tools.file.read", {"path": "/etc/passwd"})
        assert t.call("readFile", {"path": "notes.txt"}).output_json == '"hello\\n"'
        results = asyncio.run(t.acall_many([("AID.ECHO.v1", {"i": i}) for i in range(500)]))
        assert [json.loads(r.output_json) for r in results] == [{"i": i} for i in range(500)]


def test_hosts_of_a_queue_group_share_the_calls(url: str, tmp_path: Path) -> None:
    prefix = "ngroup"
    args = ["--prefix", prefix, "--queue-group", "workers"]
    with Front(url, args, log_dir=tmp_path) as a, Front(url, args, log_dir=tmp_path) as b, \
            Nats(url, prefix=prefix) as t:
        t.call_many([("AID.ECHO.v1", {"i": i}) for i in range(400)])
        served = {}
        for front in (a, b):
            stats = request(url, f"$SRV.STATS.machina-toolhost.{front.service_id}", b"")[0]
            assert {e["queue_group"] for e in stats["endpoints"]} == {"workers"}
            served[front.service_id] = sum(e["num_requests"] for e in stats["endpoints"])
        assert sum(served.values()) == 400 and min(served.values()) > 0, served


def test_an_unknown_tools_subject_is_answered_invalid_input(url: str, tmp_path: Path) -> None:
    with Front(url, ["--prefix", "nunknown"], log_dir=tmp_path) as front:
        body, headers = request(url, "tools.file.nope", {"path": "x"}, timeout=5)  # an answer, not a time-out
        assert body["data"] is None and body["error"].startswith("InvalidInput: ")
        assert "tools.file.nope" in body["error"]
        assert headers["Nats-Service-Error-Code"] == "400" and headers["Nats-Service-Error"] == body["error"]
        # A known one is answered once, by its tool.
        body, _ = request(url, "tools.file.read", {"path": "missing.txt"})
        assert body["error"].startswith("NotFound")
        stats = request(url, f"$SRV.STATS.machina-toolhost.{front.service_id}", b"")[0]
        read = next(e for e in stats["endpoints"] if e["subject"] == "tools.file.read")
        assert (read["num_requests"], read["num_errors"]) == (1, 1)


def test_a_reply_subject_under_dollar_is_not_answered(url: str, tmp_path: Path) -> None:
    prefix = "ndollar"

    async def go() -> tuple[list[bytes], list[bytes]]:
        nc = await nats.connect(url)
        try:
            trapped = await nc.subscribe("$KV.trap.>")
            inbox = await nc.subscribe("_INBOX.mine")
            await nc.publish(f"{prefix}.tool.AID.ECHO.v1", b'{"x": 1}', reply="$KV.trap.k")
            await nc.publish("$SRV.PING", b"", reply="$KV.trap.ping")
            await nc.publish(f"{prefix}.tool.AID.ECHO.v1", b'{"x": 2}', reply="_INBOX.mine")
            got = [(await inbox.next_msg(timeout=5)).data]
            await asyncio.sleep(0.3)
            caught = []
            while True:
                try:
                    caught.append((await trapped.next_msg(timeout=0.05)).data)
                except nats.errors.TimeoutError:
                    return got, caught
        finally:
            await nc.close()

    with Front(url, ["--prefix", prefix], log_dir=tmp_path) as front:
        got, caught = asyncio.run(go())
        assert [json.loads(m) for m in got] == [{"data": {"x": 2}, "error": None}] and caught == []
        assert "lies under '$'" in front.stderr()


def test_a_tool_past_its_deadline_is_answered_on_time(url: str, misbehaving: str, tmp_path: Path) -> None:
    prefix = "nslow"
    with Front(url, ["--prefix", prefix, "--plugin", misbehaving, "--plugin", str(md.builtin_plugin_path()),
                     "--concurrency", "2"], log_dir=tmp_path) as front, \
            Nats(url, prefix=prefix) as t:
        async def go() -> tuple[float, list[md.ToolResult], md.ToolResult]:
            hangs = [asyncio.ensure_future(t.acall("AID.TEST.HANG.v1", timeout=0.5, check=False)) for _ in range(2)]
            await asyncio.sleep(0.1)
            start = time.monotonic()
            results = await t.acall_many([("AID.ECHO.v1", {"i": i}) for i in range(100)])
            return time.monotonic() - start, results, (await asyncio.gather(*hangs))[0]
        elapsed, results, hang = asyncio.run(go())
        assert [json.loads(r.output_json) for r in results] == [{"i": i} for i in range(100)]
        assert elapsed < scaled(HANG_GUARD_S), f"100 echo calls took {elapsed:.2f} s beside two hanging calls"
        assert hang.kind == "timeout"
        started = time.monotonic()
        assert front.stop(timeout=10) == 0 and time.monotonic() - started < scaled(HANG_GUARD_S)
        assert "still stuck in tools past their deadline" in front.stderr()


def test_sigterm_answers_the_call_running_and_exits_promptly(url: str, tmp_path: Path) -> None:
    from test_nats import marker_pack

    pack = marker_pack(tmp_path)
    front = Front(url, ["--prefix", "nstop", "--tools", str(pack), "--packs", "none"], log_dir=tmp_path)
    with Nats(url, prefix="nstop", timeout=10) as t:
        fut = t._submit("AID.PY.MARK.v1", {"s": 1.0}, None, None, None, None, False)
        time.sleep(0.4)
        assert front.stop() == 0, front.stderr()
        assert fut.result(10).ok
    idle = Front(url, ["--prefix", "nstop2"], log_dir=tmp_path)
    started = time.monotonic()
    assert idle.stop() == 0 and time.monotonic() - started < scaled(2)


def test_cli_errors(url: str) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([TOOLHOST, *args], capture_output=True, text=True, timeout=60)
    r = run("--nats", "nats://127.0.0.1:1")
    assert r.returncode == 2 and "cannot connect to nats://127.0.0.1:1" in r.stderr
    r = run("--nats", url, "--nats-prefix", "a..b")
    assert r.returncode == 2 and "--nats-prefix" in r.stderr
    r = run("--nats", url, "--serve")
    assert r.returncode == 2
    r = run("--help")
    assert "--nats" in r.stdout and "--nats-idempotency" in r.stdout


def test_pending_cap_drops_and_the_host_keeps_serving(url: str, misbehaving: str, tmp_path: Path) -> None:
    """--workers 1 and --nats-max-pending 4: a flood beyond them is dropped (the callers are
    told no host answered), never buffered without bound."""
    prefix = "ncap"
    with Front(url, ["--prefix", prefix, "--concurrency", "1", "--nats-max-pending", "4", "--plugin", misbehaving,
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


def test_calls_are_in_the_audit_store_as_nats_calls(url: str, workspace: Path, tmp_path: Path) -> None:

    store = tmp_path / "audit" / "calls.db"
    store.parent.mkdir()
    front = Front(url, ["--audit-db", str(store), "--packs", "files", "--prefix", "naudit"],
                  env={"MACHINA_TOOLHOST_WORKSPACE": str(workspace)}, log_dir=tmp_path)
    try:
        with Nats(url, prefix="naudit") as t:
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


def test_the_user_header_names_the_caller_in_the_audit_store(url: str, workspace: Path, tmp_path: Path) -> None:
    """A body that is not the envelope takes its user from `Machina-User`; without it the
    record names none (a NATS caller has no OS user of this host's)."""
    store = tmp_path / "audit" / "calls.db"
    store.parent.mkdir()
    front = Front(url, ["--audit-db", str(store), "--packs", "files", "--prefix", "nuser"],
                  env={"MACHINA_TOOLHOST_WORKSPACE": str(workspace)}, log_dir=tmp_path)
    try:
        async def go() -> list[dict[str, object]]:
            nc = await nats.connect(url)
            try:
                body = json.dumps({"path": "notes.txt"}).encode()
                named = await nc.request("tools.file.read", body, timeout=10, headers={"Machina-User": "alice"})
                unnamed = await nc.request("tools.file.read", body, timeout=10)
            finally:
                await nc.close()
            return [json.loads(named.data), json.loads(unnamed.data)]
        answers = asyncio.run(go())
    finally:
        assert front.stop() == 0
    assert all(a["error"] is None for a in answers), answers
    con = sqlite3.connect(store)
    users = [row[0] for row in con.execute("SELECT user FROM call_log ORDER BY id")]
    con.close()
    assert users[0] == "alice" and users[1] in (None, ""), users


def test_a_timeout_on_a_tools_subject_is_worded_once(url: str, tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[shell]\nallow = ["sleep"]\n')
    with Front(url, ["--prefix", "ntime", "--policy", str(policy)], log_dir=tmp_path):
        async def go() -> dict[str, object]:
            nc = await nats.connect(url)
            try:
                msg = await nc.request("tools.shell.exec", json.dumps({"command": "sleep", "args": ["5"]}).encode(),
                                       timeout=10, headers={"Machina-Timeout-Ms": "300"})
            finally:
                await nc.close()
            answer: dict[str, object] = json.loads(msg.data)
            return answer
        answer = asyncio.run(go())
    assert answer["data"] is None
    assert str(answer["error"]).startswith("Timeout: tools.shell.exec did not finish within 300 ms"), answer


def test_the_servers_password_never_reaches_the_log(tmp_path: Path) -> None:
    config = "authorization { user: alice, password: s3cret-pass }\n"
    with nats_server(jetstream=False, config=config) as plain:
        url = plain.replace("nats://", "nats://alice:s3cret-pass@")
        front = Front(url, ["--nats-prefix", "npw"], log_dir=tmp_path)
        try:
            assert f"on {plain.replace('nats://', 'nats://***@')}" in front.stderr()
        finally:
            front.stop()
        assert "s3cret-pass" not in front.stderr()
    r = subprocess.run([TOOLHOST, "--nats", url], capture_output=True, text=True, timeout=60)  # (server gone)
    assert r.returncode != 0 and "nats://***@127.0.0.1" in r.stderr and "s3cret-pass" not in r.stderr
