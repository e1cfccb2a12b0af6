"""A plain Python NDJSON tool host speaking machina-toolhost's wire format for one tool,
AID.ECHO.v1: what a team would write first. The baseline for --serve.

    python -m bench.baselines.echo_host [json|orjson]

It parses each request, checks the aid and that input_json is JSON, and answers the same
response shape as machina-toolhost (including a ds_state delta and the echoed id). It
flushes after every line when its input is a pipe (lock-step callers wait for each answer)
and only when its input runs dry when reading a file.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable
from typing import Any

EMPTY_DELTA = {"delta": True, "slots": {}, "removed_slots": []}


def codec(name: str) -> tuple[Callable[[bytes | str], Any], Callable[[Any], bytes]]:
    if name == "orjson":
        import orjson

        return orjson.loads, orjson.dumps
    import json

    def dumps(value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":")).encode()

    return json.loads, dumps


def answer(line: bytes, loads: Callable[[bytes | str], Any], dumps: Callable[[Any], bytes]) -> bytes:
    try:
        req = loads(line)
    except ValueError as e:
        return dumps({"ok": False, "error": f"invalid request JSON: {e}", "code": "invalid_request"})
    if not isinstance(req, dict):
        return dumps({"ok": False, "error": "request must be a JSON object", "code": "invalid_request"})
    resp: dict[str, Any] = {}
    if "id" in req:
        resp["id"] = req["id"]
    if req.get("aid") != "AID.ECHO.v1":
        resp.update(ok=False, error=f"unknown aid: {req.get('aid')}", code="unknown_tool")
        return dumps(resp)
    text = req.get("input_json") or "{}"
    try:
        loads(text)
    except ValueError as e:
        resp.update(ok=False, status="INVALID_PICK", output_json="", error=f"input_json is not valid JSON: {e}",
                    code="invalid_input", ds_state=EMPTY_DELTA)
        return dumps(resp)
    resp.update(ok=True, status="OK", output_json=text, error="", ds_state=EMPTY_DELTA)
    return dumps(resp)


def main() -> None:
    loads, dumps = codec(sys.argv[1] if len(sys.argv) > 1 else "json")
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    per_line = not stat.S_ISREG(os.fstat(0).st_mode)
    for line in stdin:
        if not line.strip():
            continue
        stdout.write(answer(line, loads, dumps) + b"\n")
        if per_line:
            stdout.flush()
    stdout.flush()


if __name__ == "__main__":
    main()
