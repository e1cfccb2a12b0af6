"""Serve discipline: one response per request, ids echoed, blank lines ignored, EOF
answers what is in flight, stdout reserved for the wire, --workers."""

from __future__ import annotations

import json
import subprocess

from conftest import TOOLHOST, base_env, echo, most_at_once, ok_response, serve, serve_raw


def test_exactly_one_response_per_request_in_order(misbehaving: str) -> None:
    reqs: list[object] = []
    for i in range(300):
        reqs += [echo(i), b"not json", {"aid": "AID.NOPE.v1"}, {"aid": "AID.TEST.FAIL.v1"}]
    r = serve(reqs, "--plugin", misbehaving, "--plugin", str(__import__("machina_dispatch").builtin_plugin_path()))
    assert len(r) == len(reqs)
    for i in range(300):
        assert r[4 * i] == ok_response(str(i))
        assert r[4 * i + 1]["code"] == "malformed_request"
        assert r[4 * i + 2]["code"] == "tool_not_found"
        assert r[4 * i + 3]["code"] == "tool_error"


def test_ids_are_echoed_verbatim() -> None:
    ids = ["a", 'quote " and \\ backslash', "ünïcødé", "", 0, -5, 18446744073709551615]
    r = serve([echo(1, id=i) for i in ids] + [{"aid": "AID.NOPE.v1", "id": "e"}])
    assert [x["id"] for x in r] == [*ids, "e"]
    assert "id" not in serve([echo(1)])[0]


def test_blank_lines_are_ignored() -> None:
    proc = serve_raw(b"\n   \n\t\r\n" + json.dumps(echo(1)).encode() + b"\n\n")
    assert [json.loads(x) for x in proc.stdout.splitlines()] == [ok_response("1")]


def test_last_line_without_newline_is_answered() -> None:
    proc = serve_raw(json.dumps(echo(1)).encode() + b"\n" + json.dumps(echo(2)).encode())
    assert [json.loads(x)["output_json"] for x in proc.stdout.splitlines()] == ["1", "2"]
    assert proc.returncode == 0


def test_plugin_stdout_never_reaches_the_wire(misbehaving: str) -> None:
    proc = serve_raw(b'{"aid":"AID.TEST.PRINT.v1"}\n' * 3, "--plugin", misbehaving)
    assert [json.loads(x) for x in proc.stdout.splitlines()] == [ok_response('{"printed":true}')] * 3
    assert proc.stderr.count(b'"forged":true') == 3
    assert proc.stderr.count(b"raw bytes on fd 1") == 3


def test_run_mode_also_keeps_stdout_for_the_wire(misbehaving: str) -> None:
    proc = subprocess.run([TOOLHOST, "--run", misbehaving, "AID.TEST.PRINT.v1"], input=b"{}",
                          capture_output=True, env=base_env(), timeout=30)
    assert json.loads(proc.stdout) == ok_response('{"printed":true}', ds_state={"slots": {}})
    assert b"raw bytes on fd 1" in proc.stderr


def test_eof_answers_everything_in_flight(misbehaving: str) -> None:
    reqs = [{"aid": "AID.TEST.SLOW.v1", "input_json": '{"ms": 100, "stamps": 1}', "id": i} for i in range(8)]
    r = serve(reqs, "--plugin", misbehaving, "--workers", "8")
    assert sorted(x["id"] for x in r) == list(range(8))
    assert all(x["ok"] for x in r)
    assert most_at_once(json.loads(x["output_json"]) for x in r) >= 2  # they ran concurrently


def test_workers_let_a_response_with_an_id_overtake(misbehaving: str) -> None:
    r = serve([{"aid": "AID.TEST.SLOW.v1", "input_json": '{"ms": 400}', "id": "slow"}, echo(1, id="fast")],
              "--plugin", misbehaving, "--plugin", str(__import__("machina_dispatch").builtin_plugin_path()),
              "--workers", "2")
    assert [x["id"] for x in r] == ["fast", "slow"]


def test_workers_keep_order_without_ids(misbehaving: str) -> None:
    reqs = [{"aid": "AID.TEST.SLOW.v1", "input_json": json.dumps({"ms": ms})} for ms in (300, 0, 150, 0, 50)]
    r = serve(reqs, "--plugin", misbehaving, "--workers", "4")
    assert [json.loads(x["output_json"])["slept_ms"] for x in r] == [300, 0, 150, 0, 50]


def test_workers_answer_exactly_once_under_load(misbehaving: str) -> None:
    reqs = [{"aid": "AID.TEST.COUNTER.v1", "id": i} if i % 3 else {"aid": "AID.TEST.FAIL.v1", "id": i}
            for i in range(5000)]
    r = serve(reqs, "--plugin", misbehaving, "--workers", "8")
    assert sorted(x["id"] for x in r) == list(range(5000))
    counts = sorted(json.loads(x["output_json"])["calls"] for x in r if x["ok"])
    assert counts == list(range(1, len(counts) + 1))  # every counter call ran exactly once


def test_lock_step_client_is_answered_before_eof() -> None:
    p = subprocess.Popen([TOOLHOST, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=base_env())
    assert p.stdin and p.stdout
    for i in range(50):
        p.stdin.write(json.dumps(echo(i, id=i)).encode() + b"\n")
        p.stdin.flush()
        assert json.loads(p.stdout.readline())["id"] == i
    p.stdin.close()
    assert p.wait(timeout=10) == 0


def test_reader_going_away_ends_the_host_quietly() -> None:
    p = subprocess.Popen([TOOLHOST, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=base_env())
    assert p.stdin and p.stdout
    p.stdout.close()
    try:
        for _ in range(2000):
            p.stdin.write(json.dumps(echo("x" * 1000)).encode() + b"\n")
        p.stdin.close()
    except BrokenPipeError:
        pass
    assert p.wait(timeout=10) == 0
