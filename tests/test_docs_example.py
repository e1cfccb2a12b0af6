"""The example plugin of docs/plugins.md (docs/example_plugin/): it builds out of tree
against the installed plugin headers, warning-free, and answers exactly as the guide shows."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import machina_dispatch
import pytest
from conftest import REPO, TOOLHOST, as_line, base_env, ok_response, run_json, serve, status_error

EXAMPLE_SRC = REPO / "docs" / "example_plugin"
CONVERT = "AID.UNITS.CONVERT.v1"
LIST = "AID.UNITS.LIST.v1"
FULL_EMPTY_STATE: dict[str, Any] = {"slots": {}}  # --run answers with the full state


@pytest.fixture(scope="module")
def example_plugin(tmp_path_factory: pytest.TempPathFactory) -> str:
    build = tmp_path_factory.mktemp("example-plugin")
    cmake = shutil.which("cmake") or "cmake"
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    configure = subprocess.run(
        [cmake, "-S", str(EXAMPLE_SRC), "-B", str(build), *gen,
         f"-DMACHINA_PLUGIN_INCLUDE={machina_dispatch.get_include()}"],
        capture_output=True, text=True, check=False,
    )
    assert configure.returncode == 0, configure.stdout + configure.stderr
    compiled = subprocess.run([cmake, "--build", str(build)], capture_output=True, text=True,
                              check=False)
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    # The guide promises a warning-free build; its CMakeLists sets -Wall -Wextra.
    assert "warning" not in (compiled.stdout + compiled.stderr).lower()
    plugin = build / "example_plugin.so"
    assert plugin.exists()
    return str(plugin)


def run_plugin(plugin: str, aid: str, request: Any) -> dict[str, Any]:
    """machina-toolhost --run PLUGIN AID with `request` on stdin: the one response."""
    proc = subprocess.run([TOOLHOST, "--run", plugin, aid], input=as_line(request),
                          capture_output=True, env=base_env(), timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    answer: dict[str, Any] = json.loads(lines[0])
    return answer


def convert(plugin: str, value: Any, from_unit: str, to_unit: str) -> dict[str, Any]:
    input_json = json.dumps({"value": value, "from": from_unit, "to": to_unit})
    return run_plugin(plugin, CONVERT, {"input_json": input_json})


def test_list_shows_both_tools_with_their_metadata(example_plugin: str) -> None:
    proc = subprocess.run([TOOLHOST, "--plugin", example_plugin, "--list"],
                          capture_output=True, env=base_env(), timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    tools = json.loads(proc.stdout)["tools"]
    assert [t["aid"] for t in tools] == [CONVERT, LIST]
    first = tools[0]
    assert (first["name"], first["deterministic"], first["replay_inputs"], first["tier"],
            first["tags"], first["side_effects"]) == ("convert_units", True, True, 0, ["units"], [])
    assert first["input_schema"]["required"] == ["value", "from", "to"]
    assert first["input_schema"]["properties"]["to"]["enum"][-3:] == ["C", "F", "K"]


def test_converts_length_and_temperature(example_plugin: str) -> None:
    assert convert(example_plugin, 10, "km", "mi") == ok_response(
        '{"result":6.21371192237,"unit":"mi"}', FULL_EMPTY_STATE)
    assert convert(example_plugin, 100, "C", "F") == ok_response(
        '{"result":212,"unit":"F"}', FULL_EMPTY_STATE)


def test_reads_escaped_and_reordered_members(example_plugin: str) -> None:
    request = {"input_json": '{ "to" : "c\\u006d", "from":"in", "value": 1.5e0 }'}
    assert run_plugin(example_plugin, CONVERT, request) == ok_response(
        '{"result":3.81,"unit":"cm"}', FULL_EMPTY_STATE)


def test_unknown_unit_is_a_schema_violation(example_plugin: str) -> None:
    assert convert(example_plugin, 5, "km", "parsec") == status_error(
        "INVALID_PICK", "schema_violation",
        "input_json does not match the input schema of AID.UNITS.CONVERT.v1: "
        "at /to: value is not one of the allowed values",
        FULL_EMPTY_STATE)


def test_missing_input_is_a_schema_violation(example_plugin: str) -> None:
    # No input_json: the host's default "{}" lacks the required members.
    assert run_plugin(example_plugin, CONVERT, {}) == status_error(
        "INVALID_PICK", "schema_violation",
        "input_json does not match the input schema of AID.UNITS.CONVERT.v1: "
        "at /: missing required property 'value'",
        FULL_EMPTY_STATE)


def test_impossible_conversions_are_tool_errors(example_plugin: str) -> None:
    assert convert(example_plugin, 5, "km", "kg") == status_error(
        "TOOL_ERROR", "tool_error", "cannot convert km (length) to kg (mass)", FULL_EMPTY_STATE)
    assert convert(example_plugin, 1e308, "km", "mm") == status_error(
        "TOOL_ERROR", "tool_error", "the result is out of range", FULL_EMPTY_STATE)


def test_loaded_with_the_plugin_option(example_plugin: str) -> None:
    assert run_json(LIST, b"{}", "--plugin", example_plugin) == ok_response(
        '{"length":["mm","cm","m","km","in","ft","yd","mi"],'
        '"mass":["g","kg","oz","lb"],"temperature":["C","F","K"]}', FULL_EMPTY_STATE)


def test_serve_answers_with_deltas(example_plugin: str) -> None:
    responses = serve(
        [{"id": 1, "aid": LIST},
         {"id": 2, "aid": CONVERT, "input_json": '{"value": 100, "from": "C", "to": "F"}'},
         {"id": 3, "aid": CONVERT, "input_json": '{"value": -300, "from": "C", "to": "K"}'},
         {"id": 4, "aid": LIST, "input_json": '{"x": 1}'}],
        "--plugin", example_plugin,
    )
    assert responses == [
        ok_response('{"length":["mm","cm","m","km","in","ft","yd","mi"],'
                    '"mass":["g","kg","oz","lb"],"temperature":["C","F","K"]}', id=1),
        ok_response('{"result":212,"unit":"F"}', id=2),
        status_error("TOOL_ERROR", "tool_error", "-300 C is below absolute zero", id=3),
        status_error("INVALID_PICK", "schema_violation",
                     "input_json does not match the input schema of AID.UNITS.LIST.v1: "
                     "at /: property 'x' is not allowed", id=4),
    ]


def test_in_process_host_loads_the_plugin(example_plugin: str) -> None:
    host = machina_dispatch.Host(plugins=[example_plugin])
    request = {"aid": CONVERT, "input_json": '{"value": 1, "from": "lb", "to": "g"}'}
    response = host.call_json(json.dumps(request), machina_dispatch.Session())
    assert json.loads(response) == ok_response('{"result":453.59237,"unit":"g"}')


def test_guide_shows_the_full_source() -> None:
    guide = (REPO / "docs" / "plugins.md").read_text()
    source = (EXAMPLE_SRC / "example_plugin.cpp").read_text()
    assert source.strip() in guide
