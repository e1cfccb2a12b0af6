"""Process isolation (--isolation process): tool calls run in supervised worker
processes. A worker that segfaults, aborts, exits or overruns its deadline is killed with
its process group and replaced; only that request fails, with a structured error; the
serve session's ds_state, the idempotency cache and the leases live in the host and are
unaffected; nothing is left running."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import machina_dispatch
import process_tree
import pytest
from conftest import LEASE_SECRET, TOOLHOST, base_env, most_at_once, run, serve, serve_raw

ISOLATED = ("--isolation", "process")
BUILTIN = str(machina_dispatch.builtin_plugin_path())
EMPTY_DELTA = {"delta": True, "slots": {}, "removed_slots": []}


def req(aid: str, rid: Any = None, **fields: Any) -> dict[str, Any]:
    r: dict[str, Any] = {"aid": aid}
    if rid is not None:
        r["id"] = rid
    if "input" in fields:
        r["input_json"] = json.dumps(fields.pop("input"))
    r.update(fields)
    return r


def plugins(misbehaving: str) -> tuple[str, ...]:
    return ("--plugin", misbehaving, "--plugin", BUILTIN, "--packs", "files,shell")


def crashed(r: dict[str, Any], aid: str, how: str) -> None:
    assert r["ok"] is False and r["status"] == "TOOL_ERROR" and r["code"] == "tool_crashed", r
    assert r["error"].startswith(f"tool crashed: {aid}: the worker process {how}"), r["error"]
    assert r["ds_state"] == EMPTY_DELTA


def test_each_way_of_dying_costs_one_call(misbehaving: str) -> None:
    out = serve([req("AID.TEST.CRASH.v1", 1), req("AID.TEST.COUNTER.v1", 2),
                 req("AID.TEST.ABORT.v1", 3), req("AID.TEST.COUNTER.v1", 4),
                 req("AID.TEST.EXIT.v1", 5), req("AID.TEST.COUNTER.v1", 6),
                 req("AID.TEST.HANG.v1", 7, timeout_ms=100), req("AID.TEST.COUNTER.v1", 8)],
                *ISOLATED, *plugins(misbehaving))
    assert [r["id"] for r in out] == list(range(1, 9))
    crashed(out[0], "AID.TEST.CRASH.v1", "was killed by signal 11 (SIGSEGV: Segmentation fault)")
    crashed(out[2], "AID.TEST.ABORT.v1", "was killed by signal 6 (SIGABRT: Aborted)")
    crashed(out[4], "AID.TEST.EXIT.v1", "exited with status 3")
    assert out[6]["code"] == "timeout"
    assert out[6]["error"] == "timeout: AID.TEST.HANG.v1 did not finish within 100 ms"
    # Each counter ran in a fresh worker (the one before it died): always its first call.
    for r in out[1::2]:
        assert r["ok"] is True and json.loads(r["output_json"]) == {"calls": 1}, r


def test_each_call_runs_in_a_fresh_process_of_a_reused_worker(misbehaving: str) -> None:
    # Nothing a call leaves in its process (a counter here; a thread or a child elsewhere)
    # is there for the next call: each runs in a copy of the worker's template made for it.
    out = serve([req("AID.TEST.COUNTER.v1", i) for i in range(5)], *ISOLATED, *plugins(misbehaving))
    assert [json.loads(r["output_json"])["calls"] for r in out] == [1, 1, 1, 1, 1]
    host = machina_dispatch.InProcess(isolation="process", plugins=[misbehaving])
    try:
        for _ in range(5):
            assert host.call("AID.TEST.COUNTER.v1", {}).output == {"calls": 1}
        stats = host.stats()
        assert stats["workers_started"] == 1 and stats["worker_calls"] == 5, stats
    finally:
        host.close()


def test_crash_report_has_the_stderr_tail(misbehaving: str) -> None:
    out = serve([req("AID.TEST.PRINT.v1", 1), req("AID.TEST.NOISYCRASH.v1", 2, input={"bytes": 10})],
                *ISOLATED, *plugins(misbehaving))
    assert out[0]["ok"] is True and json.loads(out[0]["output_json"]) == {"printed": True}
    crashed(out[1], "AID.TEST.NOISYCRASH.v1", "was killed by signal 11 (SIGSEGV: Segmentation fault)")
    # Only what the crashing call wrote, not the earlier call's prints.
    assert out[1]["error"].endswith("; its last stderr: xxxxxxxxxxLAST WORDS\n")


def test_stderr_tail_is_bounded(misbehaving: str) -> None:
    [r] = serve([req("AID.TEST.NOISYCRASH.v1", 1, input={"bytes": 100000})], *ISOLATED, *plugins(misbehaving))
    head, tail = r["error"].split("; its last stderr: ")
    assert tail.endswith("LAST WORDS\n") and len(tail.encode()) == 2048


def test_a_child_process_crashing_is_not_a_worker_crash(misbehaving: str) -> None:
    script = "import os; os.abort()"
    [r] = serve([req("AID.TEST.EXEC.v1", 1, input=["python3", "-c", script])], *ISOLATED, *plugins(misbehaving))
    assert r["ok"] is True and json.loads(r["output_json"])["status"] == 128 + signal.SIGABRT


def test_stdout_of_a_tool_never_reaches_the_wire(misbehaving: str) -> None:
    proc = serve_raw(b'{"id":1,"aid":"AID.TEST.PRINT.v1"}\n{"id":2,"aid":"AID.ECHO.v1"}\n', *ISOLATED,
                     *plugins(misbehaving))
    lines = proc.stdout.splitlines()
    assert [json.loads(x)["id"] for x in lines] == [1, 2]
    assert b"forged" not in proc.stdout and b"forged" in proc.stderr


def test_state_cache_and_leases_survive_a_crash(misbehaving: str, tmp_path: Path) -> None:
    token = subprocess.run([TOOLHOST, "lease", "issue", "--aid", "AID.FILE.WRITE.v1", "--ttl", "60"],
                           capture_output=True, text=True, check=True,
                           env=base_env({"MACHINA_LEASE_SECRET": LEASE_SECRET})).stdout.strip()
    env = {"MACHINA_LEASE_ENFORCE": "1", "MACHINA_LEASE_SECRET": LEASE_SECRET,
           "MACHINA_LEASE_LEDGER": str(tmp_path / "ledger"), "MACHINA_TOOLHOST_WORKSPACE": str(tmp_path)}
    write = req("AID.FILE.WRITE.v1", input={"path": "a.txt", "content": "hi"}, _lease_token=token)
    out = serve([
        req("AID.STATE.PUT.v1", "put", input={"slot": 2, "type": "note", "content": {"v": 1}}),
        req("AID.TEST.COUNTER.v1", "c1", idempotency_key="k"),
        {**write, "id": "w1"},
        req("AID.TEST.CRASH.v1", "boom"),
        req("AID.STATE.GET.v1", "get", input={"slot": 2}),
        req("AID.TEST.COUNTER.v1", "c2", idempotency_key="k"),
        {**write, "id": "w2"},
    ], *ISOLATED, *plugins(misbehaving), env=env)
    by_id = {r["id"]: r for r in out}
    assert by_id["put"]["ok"] is True
    assert by_id["boom"]["code"] == "tool_crashed"
    got = json.loads(by_id["get"]["output_json"])
    assert got["present"] is True and got["content"] == {"v": 1}
    assert by_id["c2"]["idempotent_hit"] is True and by_id["c2"]["output_json"] == by_id["c1"]["output_json"]
    assert by_id["w1"]["ok"] is True, by_id["w1"]
    assert (tmp_path / "a.txt").read_text() == "hi"
    assert by_id["w2"] == {"id": "w2", "ok": False, "status": "TOOL_ERROR", "error": "lease_rejected",
                           "code": "lease_rejected", "reason": "consumed"}


def test_tools_read_and_write_slots_across_the_process_boundary(misbehaving: str) -> None:
    out = serve([
        req("AID.STATE.PUT.v1", 1, input={"slot": 0, "type": "t", "content": [1, 2]}),
        req("AID.STATE.GET.v1", 2, input={"slot": 0}),
        req("AID.STATE.CLEAR.v1", 3, input={"slot": 0}),
        req("AID.STATE.GET.v1", 4, input={"slot": 0}),
        req("AID.ECHO.v1", 5, ds_state={"slots": {"DS5": {"type": "big", "content_json": json.dumps("y" * 50000)}}}),
        req("AID.STATE.GET.v1", 6, input={"slot": 5}),
    ], *ISOLATED, *plugins(misbehaving))
    assert json.loads(out[0]["ds_state"]["slots"]["DS0"]["content_json"]) == [1, 2]
    assert json.loads(out[1]["output_json"])["content"] == [1, 2]
    assert out[2]["ds_state"] == {"delta": True, "slots": {}, "removed_slots": ["DS0"]}
    assert json.loads(out[3]["output_json"])["present"] is False
    assert json.loads(out[5]["output_json"])["content"] == "y" * 50000  # the state crossed to the worker


def test_same_answers_as_inline_for_well_behaved_tools(misbehaving: str) -> None:
    requests = [
        req("AID.ECHO.v1", 1, input={"a": [1, "é"]}),
        req("AID.TEXT.STATS.v1", 2, input={"text": "a b a"}),
        req("AID.TEXT.STATS.v1", 3, input={"text": 5}),
        req("AID.TEST.FAIL.v1", 4),
        req("AID.TEST.THROW.v1", 5),
        req("AID.TEST.BADJSON.v1", 6),
        req("AID.TEST.NOOUTPUT.v1", 7),
        req("AID.TEST.HUGE.v1", 8),
        req("AID.TEST.BADUTF8.v1", 9),
        req("AID.TEST.SLOTFAIL.v1", 10),
        req("AID.NOPE.v1", 11),
        req("AID.ECHO.v1", 12, input_json="{bad"),
    ]
    inline = serve(requests, *plugins(misbehaving))
    isolated = serve(requests, *ISOLATED, *plugins(misbehaving))
    assert isolated == inline


def test_frames_larger_than_a_pipe_cross_both_ways(misbehaving: str) -> None:
    # A pipe holds 64 KiB: a 4 MB input and a 900 KB output are written in pieces.
    text = "aé" * 300_000 + "b" * 2_000_000
    out = serve([req("AID.ECHO.v1", 1, input={"text": text}), req("AID.TEXT.STATS.v1", 2, input={"text": text}),
                 req("AID.ECHO.v1", 3, input={"text": "y" * 900_000})], *ISOLATED, *plugins(misbehaving),
                "--max-output-bytes", "20000000")
    assert [r["ok"] for r in out] == [True, True, True], [r.get("error") for r in out]
    assert json.loads(out[0]["output_json"]) == {"text": text}
    assert json.loads(out[2]["output_json"]) == {"text": "y" * 900_000}


def test_a_worker_killed_while_idle_costs_no_call_even_with_sigpipe_at_default() -> None:
    # Nothing was sent to a worker that ended while idle, so the next call goes to a fresh
    # one. A program that keeps SIGPIPE at its default (Python itself ignores it; this
    # script restores it) must not be killed on the way by a write into the dead worker.
    script = """
import os, signal
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
from machina_dispatch import InProcess
t = InProcess(isolation="process")
print(t.call("AID.ECHO.v1", {"a": 1}).output_json, flush=True)
me = str(os.getpid())
def parent(p):
    try:
        return open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1]
    except OSError:
        return None  # gone meanwhile
workers = [int(p) for p in os.listdir("/proc") if p.isdigit() and parent(p) == me]
assert len(workers) == 1, workers
os.kill(workers[0], signal.SIGKILL)
while open(f"/proc/{workers[0]}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
    pass  # until it is dead and its sockets closed (the host reaps it on the next call)
print(t.call("AID.ECHO.v1", {"a": 2}).output_json, flush=True)
print(t.call("AID.ECHO.v1", {"a": 3}).output_json, flush=True)
s = t.stats()
print(s["workers_lost_idle"], s["workers_started"], s["workers_crashed"], flush=True)
t.close()
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env=base_env())
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    assert proc.stdout.splitlines() == ['{"a":1}', '{"a":2}', '{"a":3}', "1 2 0"]


def test_workers_run_calls_concurrently(misbehaving: str) -> None:
    out = serve([req("AID.TEST.SLOW.v1", i, input={"ms": 300, "stamps": 1}) for i in range(4)],
                *ISOLATED, "--workers", "4", *plugins(misbehaving))
    assert all(r["ok"] for r in out) and len(out) == 4
    assert most_at_once(json.loads(r["output_json"]) for r in out) >= 2, "4 calls on 4 workers should overlap"


def test_run_mode_isolated(misbehaving: str) -> None:
    proc = run("AID.TEST.CRASH.v1", {}, *ISOLATED, *plugins(misbehaving))
    [line] = proc.stdout.splitlines()
    crashed({**json.loads(line), "ds_state": EMPTY_DELTA}, "AID.TEST.CRASH.v1", "was killed by signal 11")
    assert proc.returncode == 0


def test_timeout_kills_everything_the_call_started(misbehaving: str) -> None:
    # The sleeper starts `sleep 291` in its process group and hangs; the call process is
    # the init of a PID namespace of its own, so when it is killed at the deadline the
    # kernel ends everything in that namespace with it (its group, and any escapee).
    host = subprocess.Popen([TOOLHOST, "--serve", *ISOLATED, *plugins(misbehaving)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=base_env())
    assert host.stdin is not None and host.stdout is not None
    host.stdin.write(b'{"id":1,"aid":"AID.TEST.SLEEPER.v1","timeout_ms":1500,"input_json":"{\\"seconds\\": 291}"}\n')
    host.stdin.flush()
    sleepers: list[int] = []
    deadline = time.monotonic() + 5
    while not sleepers and time.monotonic() < deadline:
        sleepers = [p for p in process_tree.descendants(host.pid) if process_tree.cmdline(p) == ["sleep", "291"]]
        time.sleep(0.02)
    assert sleepers, "the tool's child was not seen running"
    assert json.loads(host.stdout.readline())["code"] == "timeout"
    deadline = time.monotonic() + 5
    while any(process_tree.alive(p) for p in sleepers) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(process_tree.alive(p) for p in sleepers), "the tool's child survived its call"
    host.stdin.close()
    host.wait(timeout=10)


def test_workers_die_with_the_host(misbehaving: str) -> None:
    host = subprocess.Popen([TOOLHOST, "--serve", *ISOLATED, *plugins(misbehaving)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=base_env())
    assert host.stdin is not None and host.stdout is not None
    host.stdin.write(b'{"id":1,"aid":"AID.TEST.SLEEPER.v1","timeout_ms":60000}\n')
    host.stdin.flush()
    workers: list[int] = []
    deadline = time.monotonic() + 5
    while not workers and time.monotonic() < deadline:
        workers = process_tree.children(host.pid)
        time.sleep(0.02)
    assert workers
    time.sleep(0.2)  # the sleeper child is started
    grandchildren = [g for w in workers for g in process_tree.descendants(w)]
    host.send_signal(signal.SIGKILL)
    host.wait()
    deadline = time.monotonic() + 5
    while any(process_tree.alive(p) for p in workers + grandchildren) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(process_tree.alive(p) for p in workers + grandchildren), "orphans remain after the host was killed"


def test_loading_a_plugin_that_fails_in_the_worker_is_a_crash(misbehaving: str, tmp_path: Path) -> None:
    # A copy of the plugin that disappears after the host loaded it: workers cannot load
    # it, and the call reports why instead of hanging.
    copy = tmp_path / "gone.so"
    copy.write_bytes(Path(misbehaving).read_bytes())
    host = subprocess.Popen([TOOLHOST, "--serve", *ISOLATED, "--plugin", str(copy)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=base_env())
    time.sleep(0.3)
    copy.unlink()
    out, err = host.communicate(b'{"id":1,"aid":"AID.TEST.COUNTER.v1"}\n', timeout=30)
    r = json.loads(out)
    assert r["code"] == "tool_crashed"
    assert "worker process ended before it was ready" in r["error"]
    assert "it exited with status 2" in r["error"], r["error"]  # as it ended itself, not by the host's kill
    assert "gone.so" in r["error"]  # the worker's own message, from its stderr


@pytest.mark.parametrize("flag", [["--limit-open-files", "64"], ["--no-network"]])
def test_limits_need_process_isolation(flag: list[str]) -> None:
    proc = subprocess.run([TOOLHOST, "--list", *flag], capture_output=True, env=base_env())
    assert proc.returncode == 2
    assert b"apply to isolated tools: add --isolation process" in proc.stderr
