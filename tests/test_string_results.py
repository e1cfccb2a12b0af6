"""A tool whose output is a JSON string answers, over --mcp and --skill, with that text as
its content — not the JSON that quotes it."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import TOOLHOST, base_env


def call(front: str, input_json: str) -> dict[str, object]:
    init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    lines = [{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init if front == "--mcp" else {}}]
    if front == "--mcp":
        lines.append({"jsonrpc": "2.0", "method": "notifications/initialized"})
    lines.append({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                  "params": {"name": "AID.ECHO.v1", "arguments": {}, "_meta": {"machina/input_json": input_json}}})
    out = subprocess.run([TOOLHOST, front], input="".join(json.dumps(m) + "\n" for m in lines).encode(),
                         capture_output=True, env=base_env(), timeout=30).stdout.decode()
    answer: dict[str, object] = [json.loads(x) for x in out.splitlines() if '"id":2' in x][0]["result"]
    return answer


@pytest.mark.parametrize("front", ["--mcp", "--skill"])
def test_a_string_output_is_the_content_text(front: str) -> None:
    r = call(front, json.dumps("hello\n"))
    text = r["content"][0]["text"] if front == "--mcp" else r["content"]  # type: ignore[index]
    assert text == "hello\n"
    r = call(front, '{"a": "b"}')  # any other output: its JSON text
    text = r["content"][0]["text"] if front == "--mcp" else r["content"]  # type: ignore[index]
    assert json.loads(text) == {"a": "b"}  # type: ignore[arg-type]
