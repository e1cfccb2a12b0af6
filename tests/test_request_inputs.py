"""A request's input as an object (`inputs`, as Python dispatch layers send it) beside the
JSON text (`input_json`); and a request that names its tool elsewhere (--run) refused, with
how to wrap it, when it holds the tool's input unwrapped instead of a request."""

from __future__ import annotations

import json

import pytest
from conftest import run_json, serve


def test_inputs_object_is_the_tools_input_as_written() -> None:
    [r] = serve([{"aid": "AID.ECHO.v1", "inputs": {"a": [1, {"b": 2.5}], "s": "hé"}}])
    assert r["ok"] is True and json.loads(r["output_json"]) == {"a": [1, {"b": 2.5}], "s": "hé"}
    r = run_json("AID.TEXT.STATS.v1", {"inputs": {"text": "a b a"}})
    assert r["ok"] is True and json.loads(r["output_json"])["words"] == 3
    [empty, null] = serve([{"aid": "AID.ECHO.v1", "inputs": {}}, {"aid": "AID.ECHO.v1", "inputs": None}])
    assert empty["output_json"] == "{}" and null["output_json"] == "{}"


def test_inputs_are_checked_against_the_schema_as_input_json_is() -> None:
    [r] = serve([{"aid": "AID.TEXT.STATS.v1", "inputs": {"text": 1}}])
    assert r["code"] == "schema_violation"


@pytest.mark.parametrize(("request_obj", "error"), [
    ({"aid": "AID.ECHO.v1", "inputs": {"a": 1}, "input_json": "{}"},
     "malformed request: the tool's input goes in 'input_json' (its JSON text) or in 'inputs' (an object), not both"),
    ({"aid": "AID.ECHO.v1", "inputs": [1]},
     "malformed request: field 'inputs' must be an object (the tool's input), not an array"),
    ({"aid": "AID.ECHO.v1", "inputs": "{}"},
     "malformed request: field 'inputs' must be an object (the tool's input), not a string"),
    ({"aid": "AID.ECHO.v1", "inputs": 5},
     "malformed request: field 'inputs' must be an object (the tool's input), not a number"),
])
def test_bad_inputs_are_refused(request_obj: dict[str, object], error: str) -> None:
    [r] = serve([request_obj])
    assert r == {"ok": False, "status": "INVALID_PICK", "error": error, "code": "malformed_request"}


def test_an_unwrapped_input_given_to_run_is_refused_with_how_to_wrap_it() -> None:
    r = run_json("AID.TEXT.STATS.v1", {"text": "a b", "lang": "en"})
    assert r["code"] == "malformed_request"
    assert "fields that are not request fields ('text', 'lang')" in r["error"]
    assert '{"inputs": {...}}' in r["error"] and '{"input_json": "..."}' in r["error"]
    # A request naming its input, or only request fields, is not refused.
    assert run_json("AID.ECHO.v1", {"input_json": "{}", "extension": 1})["ok"] is True
    assert run_json("AID.ECHO.v1", {"id": 3})["ok"] is True
    # --serve requests name their tool: unknown fields there stay ignored.
    [r] = serve([{"aid": "AID.ECHO.v1", "text": "x"}])
    assert r["ok"] is True
