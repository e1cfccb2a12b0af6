"""Idempotency (docs/protocol.md, the order of rules): scoped to the aid, bound to the input, single
flight, TTL and size bounds, checked after the lease gate."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from typing import Any

import machina_dispatch
from conftest import EMPTY_DELTA, LEASE_SECRET, TOOLHOST, lease_hint, ok_response, serve, serve_raw, status_error


def counter(key: str | None = None, input_json: str = "{}", **fields: Any) -> dict[str, Any]:
    req: dict[str, Any] = {"aid": "AID.TEST.COUNTER.v1", "input_json": input_json}
    if key is not None:
        req["idempotency_key"] = key
    req.update(fields)
    return req


def calls(resp: dict[str, Any]) -> int:
    return int(json.loads(resp["output_json"])["calls"])


def test_same_key_same_input_is_a_hit(misbehaving: str) -> None:
    r = serve([counter("k"), counter("k"), counter()], "--plugin", misbehaving)
    assert r[0] == ok_response('{"calls":1}')
    assert r[1] == ok_response('{"calls":1}', idempotent_hit=True)
    assert "idempotent_hit" not in r[0]
    assert calls(r[2]) == 2  # the hit did not run the tool


def test_same_key_other_input_is_a_conflict(misbehaving: str) -> None:
    r = serve([counter("k", '{"a":1}'), counter("k", '{"a":2}'), counter()], "--plugin", misbehaving)
    assert r[1] == {"ok": False, "status": "TOOL_ERROR", "code": "idempotency_conflict",
                    "error": "idempotency_key was already used with a different input for AID.TEST.COUNTER.v1"}
    assert calls(r[2]) == 2


def test_input_binding_is_exact_for_short_and_hashed_inputs(misbehaving: str) -> None:
    """Inputs up to 32 bytes are compared verbatim, longer ones by SHA-256: both bind the
    key to exactly one input, including at the boundary and across it."""
    conflict = {"ok": False, "status": "TOOL_ERROR", "code": "idempotency_conflict",
                "error": "idempotency_key was already used with a different input for AID.TEST.COUNTER.v1"}
    short = '{"s":"' + "x" * 24 + '"}'  # 32 bytes
    long_a = '{"s":"' + "x" * 25 + '"}'  # 33 bytes
    long_b = '{"s":"' + "y" * 25 + '"}'
    big_a, big_b = '{"s":"' + "z" * 5000 + 'a"}', '{"s":"' + "z" * 5000 + 'b"}'
    assert len(short) == 32 and len(long_a) == 33
    r = serve([counter("s", short), counter("s", short), counter("s", long_a),
               counter("l", long_a), counter("l", long_a), counter("l", long_b), counter("l", short),
               counter("b", big_a), counter("b", big_a), counter("b", big_b)], "--plugin", misbehaving)
    assert [x.get("idempotent_hit", False) for x in r] == [False, True, False, False, True, False, False,
                                                         False, True, False]
    assert r[2] == conflict and r[5] == conflict and r[6] == conflict and r[9] == conflict
    assert calls(r[0]) == 1 and calls(r[3]) == 2 and calls(r[7]) == 3


def test_key_is_scoped_to_the_aid(misbehaving: str) -> None:
    r = serve([counter("shared"), {"aid": "AID.ECHO.v1", "input_json": "{}", "idempotency_key": "shared"}],
              "--plugin", misbehaving, "--plugin", str(machina_dispatch.builtin_plugin_path()))
    assert r[0] == ok_response('{"calls":1}')
    assert r[1] == ok_response("{}")  # not a hit of the counter's result, not a conflict


def test_hit_answers_an_empty_delta_even_after_a_state_change() -> None:
    put = {"aid": "AID.STATE.PUT.v1", "idempotency_key": "p",
           "input_json": json.dumps({"slot": 1, "type": "t", "content": 5})}
    r = serve([put, put])
    assert r[0]["ds_state"]["slots"]["DS1"]["content_json"] == "5"
    assert r[1]["idempotent_hit"] is True
    assert r[1]["ds_state"] == EMPTY_DELTA


def test_ttl_expiry_runs_the_tool_again(misbehaving: str) -> None:
    proc_input = (json.dumps(counter("k")) + "\n").encode()
    p = subprocess.Popen([TOOLHOST, "--plugin", misbehaving, "--serve", "--idempotency-ttl-ms", "300"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert p.stdin and p.stdout
    p.stdin.write(proc_input)
    p.stdin.flush()
    first = json.loads(p.stdout.readline())
    p.stdin.write(proc_input)
    p.stdin.flush()
    second = json.loads(p.stdout.readline())
    time.sleep(0.5)
    p.stdin.write(proc_input)
    p.stdin.close()
    third = json.loads(p.stdout.readline())
    p.wait(timeout=10)
    assert (calls(first), second.get("idempotent_hit"), calls(third)) == (1, True, 2)
    assert "idempotent_hit" not in third


def test_size_bound_evicts_the_oldest(misbehaving: str) -> None:
    r = serve([counter("a"), counter("b"), counter("c"), counter("c"), counter("a")],
              "--plugin", misbehaving, "--idempotency-max-entries", "2")
    assert [calls(x) for x in r] == [1, 2, 3, 3, 4]
    assert r[3].get("idempotent_hit") is True  # c is still kept
    assert "idempotent_hit" not in r[4]        # a was evicted when c arrived


def test_default_bound_is_1024_entries(misbehaving: str) -> None:
    reqs = [counter(f"k{i}") for i in range(1025)] + [counter("k1"), counter("k0")]
    r = serve(reqs, "--plugin", misbehaving)
    assert r[1025].get("idempotent_hit") is True  # k1 kept
    assert calls(r[1026]) == 1026                  # k0 evicted by the 1025th key


def test_default_ttl_is_60_seconds() -> None:
    # The dispatch contract's IDEMP_DEFAULT_TTL_MS and IDEMP_MAX_ENTRIES, as the host's own options
    # report their defaults (waiting out 60 s is left to the short-TTL test below).
    text = subprocess.run([TOOLHOST, "--help"], capture_output=True, check=True, timeout=30).stdout.decode()
    assert re.search(r"--idempotency-ttl-ms INT:INT in \[1 - 86400000\]=60000\n", text)
    assert re.search(r"--idempotency-max-entries UINT:UINT in \[1 - 10000000\]=1024\n", text)


def test_many_unique_keys_stay_bounded(misbehaving: str) -> None:
    host = machina_dispatch.Host(plugins=[misbehaving], idempotency_max_entries=100)
    s = machina_dispatch.Session()
    for i in range(5000):
        host.call_json(json.dumps(counter(f"u{i}")), s)
    assert host.idempotency_entries == 100


def test_duplicate_in_flight_waits_for_the_first(misbehaving: str) -> None:
    slow = {"aid": "AID.TEST.SLOW.v1", "input_json": '{"ms": 300}', "idempotency_key": "s"}
    r = serve([dict(slow, id=1), dict(slow, id=2), {"aid": "AID.TEST.SLOW.v1", "input_json": '{"ms": 0}', "id": 3}],
              "--plugin", misbehaving, "--workers", "4")
    by_id = {x["id"]: x for x in r}
    assert json.loads(by_id[1]["output_json"])["slept_ms"] == 300
    assert by_id[2]["output_json"] == by_id[1]["output_json"]
    # Either duplicate may be picked up first; exactly one of them is the hit.
    assert sorted([by_id[1].get("idempotent_hit", False), by_id[2].get("idempotent_hit", False)]) == [False, True]
    # The tool ran twice in all (the slow call once, the other call once), not three times.
    assert {calls(by_id[1]), calls(by_id[3])} == {1, 2}


def test_duplicates_from_threads_of_one_process_run_once(misbehaving: str) -> None:
    # In-process: eight threads send the same keyed call while the first is still running.
    host = machina_dispatch.Host(plugins=[misbehaving])
    line = json.dumps({"aid": "AID.TEST.SLOW.v1", "input_json": '{"ms": 300}', "idempotency_key": "t"})
    results: list[dict[str, Any]] = []

    def call() -> None:
        results.append(json.loads(host.call_json(line, machina_dispatch.Session())))

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # One run: its output (with the count of calls the plugin ran) for all eight.
    assert len({r["output_json"] for r in results}) == 1
    assert sorted(r.get("idempotent_hit", False) for r in results) == [False] + [True] * 7


def test_tool_error_is_kept_but_a_fault_is_not(misbehaving: str) -> None:
    fail = {"aid": "AID.TEST.FAIL.v1", "idempotency_key": "f"}
    throw = {"aid": "AID.TEST.THROW.v1", "idempotency_key": "t"}
    r = serve([fail, fail, throw, throw], "--plugin", misbehaving)
    assert r[1] == status_error("TOOL_ERROR", "tool_error", "the tool said no", idempotent_hit=True)
    assert r[2]["code"] == r[3]["code"] == "tool_fault"
    assert "idempotent_hit" not in r[3]


def test_invalid_input_is_not_kept(misbehaving: str) -> None:
    r = serve([counter("x", "not json"), counter("x", "not json"), counter("x")], "--plugin", misbehaving)
    assert r[0]["status"] == r[1]["status"] == "INVALID_PICK"
    assert "idempotent_hit" not in r[1]
    assert calls(r[2]) == 1


def test_checked_after_the_lease_gate() -> None:
    env = {"MACHINA_LEASE_ENFORCE": "1", "MACHINA_LEASE_SECRET": LEASE_SECRET}
    token = machina_dispatch.issue_lease("AID.FILE.WRITE.v1", 30, secret=LEASE_SECRET)
    import tempfile

    with tempfile.TemporaryDirectory() as ws, tempfile.TemporaryDirectory() as ledger:
        env |= {"MACHINA_TOOLHOST_WORKSPACE": ws, "MACHINA_LEASE_LEDGER": ledger + "/l"}
        write = {"aid": "AID.FILE.WRITE.v1", "input_json": '{"path":"a.txt","content":"hi"}',
                 "idempotency_key": "w"}
        r = serve([dict(write, _lease_token=token), write], env=env)
    assert r[0]["ok"] is True
    # A cached result is no way around the lease: the second call has none.
    assert r[1] == {"ok": False, "status": "TOOL_ERROR", "error": "lease_required", "code": "lease_required", "tier": 1,
                    "aid": "AID.FILE.WRITE.v1", "hint": lease_hint("AID.FILE.WRITE.v1", 1)}


def test_blank_and_serve_raw_sanity() -> None:
    proc = serve_raw(b"\n\n")
    assert proc.stdout == b"" and proc.returncode == 0
