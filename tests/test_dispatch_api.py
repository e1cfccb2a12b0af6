"""machina_dispatch's surface: the error table covers every code of the core, the
exception classes derive from the right builtins, ToolResult's dict form, input
normalisation, ds_state objects, the native codec, finding the executable, and the
package's typing (stubs, py.typed)."""

from __future__ import annotations

import datetime
import json
import math
import os
import pickle
from pathlib import Path

import machina_dispatch as md
import pytest
from conftest import TOOLHOST
from dispatch_support import patched_environ
from machina_dispatch import _core, _errors
from machina_dispatch._inputs import to_input_json
from machina_dispatch._locate import find_executable


def test_every_core_code_has_one_error_type_that_every_front_words_it_with() -> None:
    # One column of the core's table: the audit store records it, the NATS front prefixes
    # failures on the tools.* subjects with it (tests/test_nats_native.py checks the words).
    types = {code: t for code, _, _, t in _core.error_kinds()}
    assert set(types.values()) == {"AccessDenied", "NotFound", "InvalidInput", "Timeout", "SystemError"}
    assert types["rate_limited"] == "AccessDenied" and types["idempotency_conflict"] == "InvalidInput"


def test_every_core_code_has_a_kind_and_a_class() -> None:
    codes = [code for code, _, _, _ in _core.error_kinds()]
    assert len(codes) == len(set(codes)) >= 18
    for code in codes:
        kind = _errors.kind_of_code(code)
        cls = _errors.error_class(kind)
        assert cls is not md.DispatchError, f"{code} has no exception class of its own"
        assert issubclass(cls, md.ToolhostError)
    assert _errors.kind_of_code("tool_crashed") == "crash"
    for dispatch_type in ("timeout", "crash", "parse_error", "not_found", "exception"):
        assert _errors.error_class(dispatch_type).kind == dispatch_type


@pytest.mark.parametrize(("cls", "builtin"), [
    (md.ToolTimeout, TimeoutError), (md.ToolNotFound, LookupError), (md.InvalidInput, ValueError),
    (md.ExecutableNotFound, FileNotFoundError), (md.LeaseRequired, PermissionError),
    (md.LeaseRejected, PermissionError), (md.IdempotencyConflict, ValueError), (md.ProtocolError, ValueError),
    (md.RequestRejected, ValueError),
])
def test_exceptions_are_also_builtins(cls: type, builtin: type) -> None:
    assert issubclass(cls, builtin) and issubclass(cls, md.ToolhostError)


def test_raising_carries_the_result() -> None:
    r = md.ToolResult.failure("AID.X.v1", "timeout", "too slow")
    with pytest.raises(TimeoutError) as caught:
        r.raise_for_error()
    err = caught.value
    assert isinstance(err, md.ToolTimeout)
    assert (err.aid, err.kind, err.detail, err.code, err.result) == ("AID.X.v1", "timeout", "too slow", None, r)
    assert str(err) == "AID.X.v1: too slow"
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is md.ToolTimeout and again.result == r
    with pytest.raises(md.ToolTimeout):
        _ = r.output


def test_to_dict_is_the_dispatch_dict() -> None:
    r = md.ToolResult.failure("AID.X.v1", "crash", "exited with status 3", exit_status=3)
    assert r.to_dict() == {"error": True, "aid": "AID.X.v1", "type": "crash", "detail": "exited with status 3",
                           "status": "TOOL_ERROR", "exit_status": 3}
    t = md.InProcess()
    ok = t.call("AID.ECHO.v1", {"a": 1})
    assert ok.to_dict() == {"ok": True, "status": "OK", "output_json": '{"a":1}', "error": "",
                            "ds_state": {"delta": True, "slots": {}, "removed_slots": []}}


@pytest.mark.parametrize(("inputs", "expected"), [
    (None, "{}"), ({"a": [1, None]}, '{"a":[1,null]}'), ([], "[]"), ("text as is", "text as is"),
    ("é", "é"), (b"[1]", "[1]"), (bytearray(b"2"), "2"), (True, "true"), (1.5, "1.5"), ({"é": "ü"}, '{"é":"ü"}'),
    ({1: "a"}, '{"1":"a"}'), ((1, 2), "[1,2]"), (2**70, "1180591620717411303424"),
    ([2**70, None], "[1180591620717411303424,null]"),
    ({"d": datetime.date(2026, 1, 2)}, '{"d":"2026-01-02"}'), ({"x": None, "y": [1.0]}, '{"x":null,"y":[1.0]}'),
])
def test_input_normalisation(inputs: object, expected: str) -> None:
    assert to_input_json(inputs) == expected


@pytest.mark.parametrize("bad", [{1, 2}, math.nan, object(), [1, {"a": math.inf}], {"a": (None, -math.inf)}])
def test_input_normalisation_refuses(bad: object) -> None:
    with pytest.raises(TypeError):
        to_input_json(bad)


def test_ds_state_objects() -> None:
    a = md.Artifact.of("note", {"x": [1]}, provenance="me")
    assert a.content_json == '{"x":[1]}' and a.content == {"x": [1]}
    state = md.DsState({0: a})
    assert list(state) == ["DS0"] and state["DS0"] is a and state[0] is a
    with pytest.raises(KeyError):
        state[8] = a
    with pytest.raises(KeyError):
        _ = state["DS9"]
    with pytest.raises(TypeError):
        state[1] = "not an artifact"  # type: ignore[assignment]
    wire = json.loads(state.to_json())
    assert wire == {"slots": {"DS0": {"type": "note", "content_json": '{"x":[1]}', "provenance": "me"}}}
    assert md.DsState.from_wire(wire) == state
    delta = md.DsDelta.from_json('{"delta":true,"slots":{"DS3":{"type":"t","content_json":"1","provenance":"",'
                                 '"size_bytes":1}},"removed_slots":["DS0"]}')
    state.apply(delta)
    assert list(state) == ["DS3"] and state[3].size_bytes == 1
    assert not md.DsDelta.from_json("") and md.DsDelta.from_json("") == md.DsDelta()


def test_native_codec_round_trip() -> None:
    line = _core.encode_request(7, "AID.E.v1", '{"q":"a\\"b\\n"}', "key", None, 1500, '{"slots":{}}')
    assert line.endswith(b"\n")
    assert json.loads(line) == {"id": 7, "aid": "AID.E.v1", "input_json": '{"q":"a\\"b\\n"}',
                                "idempotency_key": "key", "timeout_ms": 1500, "ds_state": {"slots": {}}}
    batch = _core.encode_requests([(1, "A", "1", None, None, None, None), (2, "B", "2", None, "tok", None, None)])
    assert [json.loads(x) for x in batch.splitlines()] == [
        {"id": 1, "aid": "A", "input_json": "1"}, {"id": 2, "aid": "B", "input_json": "2", "_lease_token": "tok"}]
    responses = (b'{"id":2,"ok":true,"status":"OK","output_json":"[2]","error":"","ds_state":{"delta":true,'
                 b'"slots":{},"removed_slots":[]}}\n{"id":1,"ok":false,"status":"TOOL_ERROR","error":"lease_required","code":'
                 b'"lease_required","tier":2,"aid":"A"}\n{"id":3')
    done, used = _core.decode_responses(responses, 0, {1: "A", 2: "B", 3: "C"})
    assert used == responses.rindex(b"\n") + 1
    (i2, r2), (i1, r1) = done
    assert (i2, r2.aid, r2.output_json, r2.ds_state_json) == (2, "B", "[2]", "")
    assert (i1, r1.code, r1.kind, r1.status, r1.details) == (1, "lease_required", "lease_required", "TOOL_ERROR",
                                                            {"tier": 2, "aid": "A"})
    with pytest.raises(ValueError, match="unknown id"):
        _core.decode_responses(b'{"id":9,"ok":true}\n', 0, {1: "A"})
    with pytest.raises(ValueError, match="unreadable"):
        _core.decode_responses(b'not json\n', 0, {1: "A"})
    # An answer without an id (a line over the size cap) goes to the oldest open request.
    done, _ = _core.decode_responses(b'{"ok":false,"status":"INVALID_PICK","error":"request exceeds the 10-byte cap",'
                                     b'"code":"request_too_large"}\n', 0, {4: "D", 5: "E"})
    assert done[0][0] == 4 and done[0][1].code == "request_too_large"


def test_delta_between_full_states() -> None:
    before = '{"slots":{"DS0":{"type":"t","content_json":"1"},"DS1":{"type":"t","content_json":"2"}}}'
    after = '{"slots":{"DS0":{"type":"t","content_json":"1","size_bytes":1},"DS2":{"type":"u","content_json":"3"}}}'
    delta = md.DsDelta.from_json(_core.delta_between(before, after))
    assert delta.removed == ("DS1",) and list(delta.slots) == ["DS2"]
    assert _core.delta_between(before, before) == ""


def test_find_executable(tmp_path: Path) -> None:
    assert find_executable(TOOLHOST) == TOOLHOST
    assert find_executable(tmp_path / "nope") is None
    fake = tmp_path / "machina-toolhost"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    with patched_environ({"MACHINA_TOOLHOST_BIN": str(fake)}):
        assert find_executable() == str(fake)
    with patched_environ({}):
        found = find_executable()
        assert found is not None and Path(found).resolve() == Path(TOOLHOST).resolve()
        assert open(found, "rb").read(4) == b"\x7fELF"  # the real executable, not a shell shim


def test_package_is_typed() -> None:
    pkg = Path(md.__file__).parent
    assert (pkg / "py.typed").exists() and (pkg / "_core.pyi").exists()
    assert set(md.__all__) <= set(dir(md))
    assert md.__version__ == _core.__version__


def test_timeout_validation() -> None:
    with pytest.raises(ValueError):
        md.InProcess(timeout=0)
    t = md.InProcess()
    with pytest.raises(ValueError):
        t.call("AID.ECHO.v1", timeout=-1)
    assert os.environ.get("MACHINA_TOOLHOST_TIMEOUT") is None or t.timeout > 0
