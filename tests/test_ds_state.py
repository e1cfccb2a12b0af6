"""ds_state: eight slots, full and delta encodings, per-session state in serve mode,
delta responses, full state in run mode."""

from __future__ import annotations

import json
from typing import Any

import machina_dispatch
from conftest import EMPTY_DELTA, ok_response, run_json, serve


def art(content: Any, type_: str = "note", provenance: str = "test") -> dict[str, Any]:
    text = json.dumps(content, separators=(",", ":"))
    return {"type": type_, "content_json": text, "provenance": provenance, "size_bytes": len(text)}


def put(slot: int, content: Any, **fields: Any) -> dict[str, Any]:
    return {"aid": "AID.STATE.PUT.v1",
            "input_json": json.dumps({"slot": slot, "type": "note", "content": content, "provenance": "test"}),
            **fields}


def get(slot: int, **fields: Any) -> dict[str, Any]:
    return {"aid": "AID.STATE.GET.v1", "input_json": json.dumps({"slot": slot}), **fields}


def got(resp: dict[str, Any]) -> Any:
    out = json.loads(resp["output_json"])
    return out["content"] if out["present"] else None


def test_session_state_persists_across_requests_and_responses_are_deltas() -> None:
    r = serve([put(0, "a"), put(7, [1]), get(0), put(0, "a"), {"aid": "AID.STATE.CLEAR.v1",
                                                                 "input_json": '{"slot": 7}'}, get(7)])
    assert r[0]["ds_state"] == {"delta": True, "slots": {"DS0": art("a")}, "removed_slots": []}
    assert r[1]["ds_state"] == {"delta": True, "slots": {"DS7": art([1])}, "removed_slots": []}
    assert got(r[2]) == "a" and r[2]["ds_state"] == EMPTY_DELTA
    assert r[3]["ds_state"] == EMPTY_DELTA  # the same value again changes nothing
    assert r[4]["ds_state"] == {"delta": True, "slots": {}, "removed_slots": ["DS7"]}
    assert got(r[5]) is None


def test_full_state_request_replaces_the_session_state() -> None:
    r = serve([put(1, "old"), get(1, ds_state={"slots": {"DS2": art("new")}}), get(2)])
    assert got(r[1]) is None  # DS1 is gone: a full state replaces everything
    assert got(r[2]) == "new"


def test_delta_request_patches_the_session_state() -> None:
    r = serve([put(1, "one"), put(2, "two"),
               get(1, ds_state={"delta": True, "slots": {"DS3": art(3)}, "removed_slots": ["DS2"]}),
               get(2), get(3)])
    assert got(r[2]) == "one"
    assert got(r[3]) is None
    assert got(r[4]) == 3


def test_state_per_call_keeps_nothing_between_requests() -> None:
    # --state-per-call (the pool's mode): each request runs with the state it carries, or
    # none; deltas are against what it carried; nothing reaches the next request.
    for workers in ("1", "2"):
        r = serve([put(0, "a"), get(0), get(1, ds_state={"slots": {"DS1": art("sent")}}), get(1),
                   put(2, "b", ds_state={"delta": True, "slots": {"DS3": art(3)}, "removed_slots": []}), get(3)],
                  "--state-per-call", "--workers", workers)
        assert r[0]["ds_state"] == {"delta": True, "slots": {"DS0": art("a")}, "removed_slots": []}
        assert got(r[1]) is None and r[1]["ds_state"] == EMPTY_DELTA
        assert got(r[2]) == "sent" and r[2]["ds_state"] == EMPTY_DELTA
        assert got(r[3]) is None
        assert r[4]["ds_state"]["slots"].keys() == {"DS2"}  # a delta request patches an empty state
        assert got(r[5]) is None


def test_sessions_are_per_serve_process() -> None:
    assert got(serve([put(4, "mine")])[0] and serve([get(4)])[0]) is None


def test_run_mode_answers_the_full_state() -> None:
    resp = run_json("AID.STATE.PUT.v1", {"input_json": json.dumps({"slot": 5, "type": "note", "content": {"k": 1},
                                                                    "provenance": "test"}),
                                         "ds_state": {"slots": {"DS0": art("kept")}}})
    assert resp["ds_state"] == {"slots": {"DS0": art("kept"), "DS5": art({"k": 1})}}


def test_state_is_applied_even_if_the_call_fails() -> None:
    r = serve([{"aid": "AID.NOPE.v1", "ds_state": {"slots": {"DS6": art("x")}}}, get(6)])
    assert r[0]["code"] == "tool_not_found"
    assert got(r[1]) == "x"


def test_a_failed_call_changes_no_state(misbehaving: str) -> None:
    r = serve([{"aid": "AID.TEST.SLOTFAIL.v1"}, get(0)],
              "--plugin", misbehaving, "--plugin", str(machina_dispatch.builtin_plugin_path()))
    assert r[0]["ds_state"] == EMPTY_DELTA
    assert got(r[1]) is None


def test_size_bytes_defaults_to_the_content_length() -> None:
    r = serve([get(0, ds_state={"slots": {"DS0": {"type": "t", "content_json": "[1,2,3]"}}})])
    out = json.loads(r[0]["output_json"])
    assert (out["size_bytes"], out["provenance"]) == (7, "")


def test_in_process_sessions_match_serve() -> None:
    host = machina_dispatch.Host()
    s = machina_dispatch.Session()
    reqs = [put(0, "a"), get(0), {"aid": "AID.STATE.CLEAR.v1", "input_json": '{"slot": 0}'}]
    in_process = [json.loads(host.call_json(json.dumps(q), s)) for q in reqs]
    assert in_process == serve(reqs)
    assert json.loads(s.state_json()) == {"slots": {}}


def test_invalid_state_is_refused_before_anything_runs(misbehaving: str) -> None:
    r = serve([{"aid": "AID.TEST.COUNTER.v1", "ds_state": {"slots": {"DS8": art(1)}}},
               {"aid": "AID.TEST.COUNTER.v1"}], "--plugin", misbehaving)
    assert r[0] == {"ok": False, "status": "INVALID_PICK", "code": "invalid_ds_state",
                    "error": "invalid ds_state: unknown slot 'DS8' (slots are DS0..DS7, or 0..7)"}
    assert r[1] == ok_response('{"calls":1}')
