"""Deadlines enforced by the host: a default per tool, a per-request `timeout_ms`, a
host-wide ceiling; inline mode answers on time even though the stuck thread cannot be
stopped, counts such threads and bounds them; timeouts feed the circuit breaker."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest
from conftest import HANG_GUARD_S, PAST_GUARD_S, TOOLHOST, base_env, run, scaled, serve, serve_raw

HANG = "AID.TEST.HANG.v1"
SLOW = "AID.TEST.SLOW.v1"
COUNTER = "AID.TEST.COUNTER.v1"
OWN_DEFAULT = "AID.TEST.TIMEOUT_DEFAULT.v1"  # declares a 150 ms default


def req(aid: str, rid: Any = None, **fields: Any) -> dict[str, Any]:
    r: dict[str, Any] = {"aid": aid}
    if rid is not None:
        r["id"] = rid
    if "input" in fields:
        r["input_json"] = json.dumps(fields.pop("input"))
    r.update(fields)
    return r


def timeout_error(aid: str, ms: int) -> str:
    return f"timeout: {aid} did not finish within {ms} ms"


def test_request_timeout_answers_on_time_and_serving_goes_on(misbehaving: str) -> None:
    started = time.monotonic()
    out = serve([req(HANG, 1, timeout_ms=200), req(COUNTER, 2), req(HANG, 3, timeout_ms=100), req(COUNTER, 4)],
                "--plugin", misbehaving)
    elapsed = time.monotonic() - started
    assert [r.get("id") for r in out] == [1, 2, 3, 4]
    assert out[0]["code"] == "timeout" and out[0]["status"] == "TOOL_ERROR"
    assert out[0]["error"] == timeout_error(HANG, 200)
    assert out[2]["error"] == timeout_error(HANG, 100)
    # The counter ran on the replacement serving threads, in order, exactly once each.
    assert json.loads(out[1]["output_json"]) == {"calls": 1}
    assert json.loads(out[3]["output_json"]) == {"calls": 2}
    assert elapsed < scaled(HANG_GUARD_S), "the two hangs must cost their deadlines, not forever"


def test_timeout_response_has_the_dispatch_shape(misbehaving: str) -> None:
    [r] = serve([req(HANG, "x", timeout_ms=50)], "--plugin", misbehaving)
    assert r == {"id": "x", "ok": False, "status": "TOOL_ERROR", "output_json": "",
                 "error": timeout_error(HANG, 50), "code": "timeout",
                 "ds_state": {"delta": True, "slots": {}, "removed_slots": []}}


def test_host_default_and_ceiling(misbehaving: str) -> None:
    out = serve([req(HANG, 1), req(HANG, 2, timeout_ms=5000)], "--plugin", misbehaving,
                "--timeout-ms", "120", "--max-timeout-ms", "250")
    assert out[0]["error"] == timeout_error(HANG, 120)  # the host default
    assert out[1]["error"] == timeout_error(HANG, 250)  # the request asked for more than the ceiling


def test_tool_default_operator_override_and_request(misbehaving: str) -> None:
    slow = {"ms": 400}
    out = serve([req(OWN_DEFAULT, 1, input=slow)], "--plugin", misbehaving)
    assert out[0]["error"] == timeout_error(OWN_DEFAULT, 150)  # the tool's own default
    out = serve([req(OWN_DEFAULT, 1, input=slow)], "--plugin", misbehaving, "--tool-timeout", f"{OWN_DEFAULT}=60")
    assert out[0]["error"] == timeout_error(OWN_DEFAULT, 60)  # the operator's setting wins over the tool's
    out = serve([req(OWN_DEFAULT, 1, input=slow, timeout_ms=1000)], "--plugin", misbehaving,
                "--tool-timeout", f"{OWN_DEFAULT}=60")
    assert out[0]["ok"] is True  # the request's own deadline wins over both


def test_list_reports_each_tools_deadline(misbehaving: str) -> None:
    proc = subprocess.run([TOOLHOST, "--plugin", misbehaving, "--list", "--timeout-ms", "777",
                           "--tool-timeout", f"{SLOW}=99"], capture_output=True, env=base_env(), check=True)
    tools = {t["aid"]: t for t in json.loads(proc.stdout)["tools"]}
    assert tools[OWN_DEFAULT]["timeout_ms"] == 150
    assert tools[SLOW]["timeout_ms"] == 99
    assert tools[COUNTER]["timeout_ms"] == 777


@pytest.mark.parametrize("bad", ["0", "-5", "1.5", '"100"', "true", "[1]", "2147483648"])
def test_bad_timeout_ms_is_refused(bad: str) -> None:
    line = b'{"id":1,"aid":"AID.ECHO.v1","timeout_ms":' + bad.encode() + b"}\n"
    proc = serve_raw(line + b'{"id":2,"aid":"AID.ECHO.v1","timeout_ms":null}\n')
    first, second = (json.loads(x) for x in proc.stdout.splitlines())
    assert first == {"id": 1, "ok": False, "status": "INVALID_PICK", "code": "malformed_request",
                     "error": "malformed request: field 'timeout_ms' must be a whole number of milliseconds "
                              "from 1 to 2147483647"}
    assert second["ok"] is True  # null means absent


@pytest.mark.parametrize("value,ok", [("abc", False), ("=5", False), ("AID.X=0", False), ("AID.X=12", True)])
def test_tool_timeout_option_is_checked(value: str, ok: bool) -> None:
    proc = subprocess.run([TOOLHOST, "--list", "--tool-timeout", value], capture_output=True, env=base_env())
    assert (proc.returncode == 0) is ok, proc.stderr
    if not ok:
        assert b"expected AID=MILLISECONDS" in proc.stderr


def test_run_answers_on_time_and_exits(misbehaving: str) -> None:
    started = time.monotonic()
    proc = run(HANG, {"timeout_ms": 150}, "--plugin", misbehaving, timeout=PAST_GUARD_S)
    assert time.monotonic() - started < scaled(5)
    assert proc.returncode == 0
    [line] = proc.stdout.splitlines()
    assert json.loads(line) == {"ok": False, "status": "TOOL_ERROR", "output_json": "",
                                "error": timeout_error(HANG, 150), "code": "timeout",
                                "ds_state": {"slots": {}}}


def test_workers_mode_replaces_a_stuck_thread(misbehaving: str) -> None:
    # Two worker threads; four hangs in a row must not exhaust them.
    requests = [req(HANG, f"h{i}", timeout_ms=100) for i in range(4)] + [req(COUNTER, f"c{i}") for i in range(20)]
    out = serve(requests, "--plugin", misbehaving, "--workers", "2")
    by_id = {r["id"]: r for r in out}
    assert len(out) == len(requests) == len(by_id)
    assert all(by_id[f"h{i}"]["code"] == "timeout" for i in range(4))
    assert sorted(json.loads(by_id[f"c{i}"]["output_json"])["calls"] for i in range(20)) == list(range(1, 21))


def test_stuck_threads_are_bounded(misbehaving: str) -> None:
    # At most 2 stuck threads: the third call is refused without running anything.
    out = serve([req(HANG, 1, timeout_ms=50), req(HANG, 2, timeout_ms=50), req(COUNTER, 3), req(HANG, 4),
                 req("AID.ECHO.v1", 5)],
                "--plugin", misbehaving, "--plugin", str(_builtin()), "--max-stuck-calls", "2",
                "--breaker-threshold", "100")
    assert [r["code"] for r in out[:2]] == ["timeout", "timeout"]
    overloaded = {"ok": False, "status": "TOOL_ERROR", "code": "overloaded",
                  "error": "overloaded: 2 calls are stuck in tools past their deadline; new calls are refused "
                           "until some return"}
    for r, rid in zip(out[2:], (3, 4, 5), strict=True):
        assert {k: r[k] for k in ("ok", "code", "error")} == {k: overloaded[k] for k in ("ok", "code", "error")}
        assert r["id"] == rid


def _builtin() -> str:
    import machina_dispatch

    return str(machina_dispatch.builtin_plugin_path())


def test_stuck_thread_is_reported_on_stderr(misbehaving: str) -> None:
    proc = serve_raw(b'{"aid":"AID.TEST.HANG.v1","timeout_ms":30}\n', "--plugin", misbehaving)
    assert b"AID.TEST.HANG.v1 overran its 30 ms deadline; its thread is stuck in the tool (1 stuck, at most 16)" \
        in proc.stderr
    assert b"exiting with 1 call(s) still stuck in tools past their deadline" in proc.stderr
    assert proc.returncode == 0


def test_a_late_result_is_discarded_and_reported(misbehaving: str) -> None:
    out = serve([req(SLOW, 1, input={"ms": 300}, timeout_ms=50), req(SLOW, 2, input={"ms": 400})],
                "--plugin", misbehaving)
    assert out[0]["code"] == "timeout"
    # The slow call returned late (discarded); the next one is the second to finish.
    assert json.loads(out[1]["output_json"])["slept_ms"] == 400


def test_timeouts_open_the_breaker(misbehaving: str) -> None:
    out = serve([req(HANG, i, timeout_ms=20) for i in range(3)] + [req(HANG, 9, timeout_ms=20)],
                "--plugin", misbehaving, "--breaker-threshold", "3")
    assert [r["code"] for r in out] == ["timeout", "timeout", "timeout", "breaker_open"]
    assert out[3]["status"] == "BREAKER_TRIP"


def test_idempotent_duplicate_gets_the_timeout_not_a_second_run(misbehaving: str) -> None:
    # The first call times out; a later call with the same key and input runs again
    # (a timeout is not a result to replay), while the key is not in conflict.
    out = serve([req(SLOW, 1, input={"ms": 300}, timeout_ms=50, idempotency_key="k"),
                 req(SLOW, 2, input={"ms": 300}, idempotency_key="k")],
                "--plugin", misbehaving)
    assert out[0]["code"] == "timeout"
    assert out[1]["ok"] is True and "idempotent_hit" not in out[1]


def test_fast_calls_are_not_affected_by_deadlines() -> None:
    out = serve([req("AID.ECHO.v1", i, input=i, timeout_ms=1000) for i in range(200)])
    assert [json.loads(r["output_json"]) for r in out] == list(range(200))
