"""Statuses: INVALID_PICK before a tool runs, TOOL_ERROR from the tool, BREAKER_TRIP
from the per-tool breaker over host-side failures only."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from conftest import TOOLHOST, base_env, ok_response, serve, status_error


def test_invalid_json_input_is_invalid_pick_and_the_tool_does_not_run(misbehaving: str) -> None:
    r = serve([{"aid": "AID.TEST.COUNTER.v1", "input_json": "{oops"}, {"aid": "AID.TEST.COUNTER.v1"}],
              "--plugin", misbehaving)
    assert r[0] == status_error("INVALID_PICK", "invalid_input",
                                "input_json is not valid JSON: invalid JSON at byte 2: "
                                "syntax error while parsing object key - invalid literal")
    assert r[1] == ok_response('{"calls":1}')


def test_schema_violation_is_invalid_pick() -> None:
    r = serve([{"aid": "AID.TEXT.STATS.v1", "input_json": '{"text": "a", "extra": 1}'},
               {"aid": "AID.TEXT.STATS.v1", "input_json": '{"text": "a", "top": 101}'},
               {"aid": "AID.TEXT.STATS.v1", "input_json": "[]"},
               {"aid": "AID.TEXT.STATS.v1", "input_json": '{"text": "a b a", "top": 1}'}])
    prefix = "input_json does not match the input schema of AID.TEXT.STATS.v1: "
    assert r[0] == status_error("INVALID_PICK", "schema_violation", prefix + "at /: property 'extra' is not allowed")
    assert r[1] == status_error("INVALID_PICK", "schema_violation", prefix + "at /top: must be <= 100")
    assert r[2] == status_error("INVALID_PICK", "schema_violation", prefix + "at /: expected object, got array")
    assert json.loads(r[3]["output_json"]) == {"bytes": 5, "chars": 5, "lines": 1, "words": 3,
                                               "top_words": [{"word": "a", "count": 2}]}


def test_schema_violation_does_not_run_the_tool(tmp_path: Path) -> None:
    # FILE.WRITE has a visible effect: a request refused by its schema writes nothing,
    # the same request made valid does.
    bad = {"path": "f.txt", "content": "x", "mode": "w"}
    r = serve([{"aid": "AID.FILE.WRITE.v1", "input_json": json.dumps(bad)}],
              env={"MACHINA_TOOLHOST_WORKSPACE": str(tmp_path)})
    assert r[0]["status"] == "INVALID_PICK" and r[0]["code"] == "schema_violation"
    assert not (tmp_path / "f.txt").exists()
    del bad["mode"]
    r = serve([{"aid": "AID.FILE.WRITE.v1", "input_json": json.dumps(bad)}],
              env={"MACHINA_TOOLHOST_WORKSPACE": str(tmp_path)})
    assert r[0]["ok"] is True and (tmp_path / "f.txt").read_text() == "x"


def test_tool_error_comes_from_the_tool(misbehaving: str) -> None:
    r = serve([{"aid": "AID.TEST.FAIL.v1"}, {"aid": "AID.TEST.BADUTF8.v1"}], "--plugin", misbehaving)
    assert r[0] == status_error("TOOL_ERROR", "tool_error", "the tool said no")
    # A message that is not UTF-8 is repaired, never passed on raw.
    assert r[1] == status_error("TOOL_ERROR", "tool_error", "bad \ufffd byte")


def test_host_side_failures_are_tool_errors_with_their_own_codes(misbehaving: str) -> None:
    r = serve([{"aid": "AID.TEST.THROW.v1"}, {"aid": "AID.TEST.BADJSON.v1"}, {"aid": "AID.TEST.NOOUTPUT.v1"}],
              "--plugin", misbehaving)
    assert r[0] == status_error("TOOL_ERROR", "tool_fault", "tool fault: tool raised: deliberate failure")
    assert r[1] == status_error("TOOL_ERROR", "invalid_output",
                                "tool output is not valid JSON: invalid JSON at byte 3: "
                                "syntax error while parsing object key - invalid literal")
    assert r[2] == status_error("TOOL_ERROR", "invalid_output", "tool reported success without an output")


BREAKER_OPEN = status_error("BREAKER_TRIP", "breaker_open",
                            "circuit breaker open for AID.TEST.THROW.v1: too many host-side failures")


def test_breaker_trips_after_threshold_host_side_failures(misbehaving: str) -> None:
    reqs = [{"aid": "AID.TEST.THROW.v1"}] * 6 + [{"aid": "AID.TEST.COUNTER.v1"}]
    r = serve(reqs, "--plugin", misbehaving)
    assert [x["code"] for x in r[:5]] == ["tool_fault"] * 5
    assert r[5] == BREAKER_OPEN
    assert r[6] == ok_response('{"calls":1}')  # per tool: others are unaffected


def test_tool_errors_never_trip_the_breaker(misbehaving: str) -> None:
    r = serve([{"aid": "AID.TEST.FAIL.v1"}] * 20, "--plugin", misbehaving)
    assert {x["code"] for x in r} == {"tool_error"}


def test_breaker_threshold_is_configurable(misbehaving: str) -> None:
    r = serve([{"aid": "AID.TEST.BADJSON.v1"}] * 3, "--plugin", misbehaving, "--breaker-threshold", "2")
    assert [x["code"] for x in r] == ["invalid_output", "invalid_output", "breaker_open"]


def test_breaker_cools_down_then_a_failure_reopens_it(misbehaving: str) -> None:
    p = subprocess.Popen([TOOLHOST, "--plugin", misbehaving, "--serve", "--breaker-threshold", "2",
                          "--breaker-cooldown-ms", "300"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=base_env())
    assert p.stdin and p.stdout

    def call(aid: str) -> str:
        assert p.stdin and p.stdout
        p.stdin.write(json.dumps({"aid": aid}).encode() + b"\n")
        p.stdin.flush()
        return str(json.loads(p.stdout.readline()).get("code", "ok"))

    try:
        assert [call("AID.TEST.THROW.v1") for _ in range(3)] == ["tool_fault", "tool_fault", "breaker_open"]
        time.sleep(0.4)
        assert call("AID.TEST.THROW.v1") == "tool_fault"    # the trial call runs...
        assert call("AID.TEST.THROW.v1") == "breaker_open"  # ...and its failure re-opens at once
    finally:
        p.stdin.close()
        p.wait(timeout=10)
