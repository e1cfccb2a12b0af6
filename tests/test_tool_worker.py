"""The Python tool worker (machina_dispatch.tool_worker) speaks tool protocol v1 exactly: a
tool module written for tool protocol v1's one-shot runner gives the same answers through our
worker, one-shot and warm (--serve); what a tool prints never reaches the protocol stream;
a changed module is reloaded; bad requests get an answer and the worker keeps serving."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from python_support import LITERAL_RUNNER

SAMPLE = textwrap.dedent('''
    import decimal, os, sys

    class Blocked(Exception):
        reason_code = "guarantee_blocked"

    def greet(payload):
        return {"message": "Hello " + payload["name"], "ok": True}

    def missing(payload):
        raise ValueError("Missing input")

    def blocked(payload):
        raise Blocked("no network for this tool")

    class Check:
        reason = "guarantee_blocked"

    class CapabilityError(Exception):
        check = Check()

    def checked(payload):
        raise CapabilityError("the check said no")

    def noisy(payload):
        print("to stdout")
        print("to stderr", file=sys.stderr)
        os.write(1, b"straight to descriptor 1\\n")
        return payload

    def money(payload):
        return {"whole": decimal.Decimal("3.00"), "part": decimal.Decimal("2.50")}

    def opaque(payload):
        return {1, 2}

    class Nested:
        @staticmethod
        def run(payload):
            return [payload, "nested"]
''')

CASES = [("greet", {"name": "Ada"}), ("missing", {}), ("blocked", {}), ("money", {}),
         ("Nested.run", {"x": 1}), ("nothere", {})]


@pytest.fixture
def app(tmp_path: Path) -> Path:
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "__init__.py").write_text("")
    (tmp_path / "tools" / "sample_tool.py").write_text(SAMPLE)
    return tmp_path


def request(fn: str, payload: Any, **extra: Any) -> dict[str, Any]:
    return {"protocol_version": 1, "tool": fn, "entry": f"tools.sample_tool:{fn}", "payload": payload,
            "sandbox": False, "trace_id": "t-1", "capability_context": {"guarantees": {}}, **extra}


def worker(app: Path, *args: str, data: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "machina_dispatch.tool_worker", "--root", str(app), *args],
                          input=data, capture_output=True, timeout=60, cwd="/")


def protocol_part(answer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in answer.items() if k != "trace"}


def test_a_tool_for_the_original_runner_answers_the_same_through_ours(app: Path) -> None:
    literal, once = [], []
    for fn, payload in CASES:
        data = json.dumps(request(fn, payload)).encode()
        lit = subprocess.run([sys.executable, "-c", LITERAL_RUNNER], input=data, capture_output=True, cwd=app,
                             timeout=60)
        assert lit.returncode == 0, lit.stderr
        literal.append(json.loads(lit.stdout))
        ours = worker(app, data=data)
        assert ours.returncode == 0, ours.stderr
        [line] = ours.stdout.splitlines()
        once.append(json.loads(line))
    lines = b"".join(json.dumps(request(fn, payload)).encode() + b"\n" for fn, payload in CASES)
    served = worker(app, "--serve", data=lines)
    assert served.returncode == 0, served.stderr
    warm = [json.loads(line) for line in served.stdout.splitlines()]
    assert [protocol_part(a) for a in once] == literal
    assert [protocol_part(a) for a in warm] == literal
    assert literal[0]["result"] == {"message": "Hello Ada", "ok": True}
    assert literal[2]["error"] == {"type": "Blocked", "message": "no network for this tool",
                                   "reason_code": "guarantee_blocked"}
    assert literal[3]["result"] == {"whole": 3, "part": "2.5"}
    assert literal[5]["error"]["type"] == "AttributeError"
    for a in once + warm:
        assert a["trace"]["trace_id"] == "t-1" and a["trace"]["protocol_version"] == 1
        assert a["trace"]["python_path"] == sys.executable and a["trace"]["duration_ms"] >= 0


def test_an_exception_carrying_a_check_answers_its_reason_as_reason_code(app: Path) -> None:
    [line] = worker(app, data=json.dumps(request("checked", {})).encode()).stdout.splitlines()
    assert json.loads(line)["error"] == {"type": "CapabilityError", "message": "the check said no",
                                         "reason_code": "guarantee_blocked"}


def test_what_a_tool_prints_never_reaches_the_protocol_stream(app: Path) -> None:
    lines = (json.dumps(request("noisy", {"n": 1})) + "\n" + json.dumps(request("greet", {"name": "B"})) + "\n")
    served = worker(app, "--serve", data=lines.encode())
    answers = [json.loads(line) for line in served.stdout.splitlines()]  # every line is an answer
    assert [a["ok"] for a in answers] == [True, True]
    assert answers[0]["result"] == {"n": 1}
    assert answers[0]["trace"]["stdout"] == "to stdout\n"
    assert answers[0]["trace"]["stderr"] == "to stderr\n"
    assert b"straight to descriptor 1" in served.stderr  # around sys.stdout: to stderr, not the stream


def test_printing_is_captured_up_to_its_cap(app: Path) -> None:
    (app / "tools" / "loud.py").write_text("def run(p):\n    print('x' * 200_000)\n    return 1\n")
    data = json.dumps({"protocol_version": 1, "entry": "tools.loud:run", "payload": {}}).encode()
    answer = json.loads(worker(app, data=data).stdout)
    assert answer["ok"] and len(answer["trace"]["stdout"]) == 64 * 1024 and answer["trace"]["output_truncated"]
    assert answer["trace"]["trace_id"]  # none given: a fresh one


def test_a_changed_module_is_reloaded_by_a_warm_worker(app: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "machina_dispatch.tool_worker", "--serve", "--root", str(app)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        def ask(fn: str) -> dict[str, Any]:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(json.dumps(request(fn, {"name": "Ada"})).encode() + b"\n")
            proc.stdin.flush()
            return dict(json.loads(proc.stdout.readline()))

        first = ask("greet")
        assert first["result"]["message"] == "Hello Ada" and "module_reloaded" not in first["trace"]
        source = app / "tools" / "sample_tool.py"
        source.write_text(SAMPLE.replace('"Hello "', '"Good day, "'))
        stamp = time.time() + 5
        os.utime(source, (stamp, stamp))  # a new mtime even on a coarse clock
        second = ask("greet")
        assert second["result"]["message"] == "Good day, Ada" and second["trace"]["module_reloaded"]
        assert "module_reloaded" not in ask("greet")["trace"]  # once
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0


def test_bad_requests_are_answered_and_the_worker_keeps_serving(app: Path) -> None:
    lines = b"".join([b"{not json\n", b"[1, 2]\n", b'{"entry": "no_colon", "payload": {}}\n',
                      json.dumps(request("greet", {"name": "A"}, protocol_version=2)).encode() + b"\n",
                      b"x" * 5000 + b"\n", json.dumps(request("opaque", {})).encode() + b"\n",
                      json.dumps(request("greet", {"name": "Z"})).encode() + b"\n"])
    served = worker(app, "--serve", "--max-line-bytes", "4096", data=lines)
    answers = [json.loads(line) for line in served.stdout.splitlines()]
    assert len(answers) == 7 and served.returncode == 0
    assert [a["ok"] for a in answers] == [False] * 6 + [True]
    assert "not JSON" in answers[0]["error"]["message"]
    assert "JSON object" in answers[1]["error"]["message"]
    assert "module:function" in answers[2]["error"]["message"]
    assert "protocol_version 2" in answers[3]["error"]["message"]
    assert "longer than 4096 bytes" in answers[4]["error"]["message"]
    assert answers[5]["error"]["type"] == "TypeError" and "no JSON form" in answers[5]["error"]["message"]
    assert answers[6]["result"]["message"] == "Hello Z"


def test_one_shot_exit_status_is_the_originals(app: Path) -> None:
    failed = worker(app, data=json.dumps(request("missing", {})).encode())
    assert failed.returncode == 0 and json.loads(failed.stdout)["error"]["type"] == "ValueError"
    not_json = worker(app, data=b"{oops")
    assert not_json.returncode == 1 and json.loads(not_json.stdout)["ok"] is False
    opaque = worker(app, data=json.dumps(request("opaque", {})).encode())
    assert opaque.returncode == 1 and json.loads(opaque.stdout)["error"]["type"] == "TypeError"
