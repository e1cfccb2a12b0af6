"""machina-toolhost --skill: the host loaded as a skill. Driven with the skill protocol's
manual session (the three lines of its Testing section), with lifecycle methods, and by our
own skill runner (a host hosting a host), in-process and over --serve."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import machina_dispatch as md
import pytest
from conftest import TOOLHOST, serve
from jsonrpc_support import LineClient, manifest, probe_log, probe_skill, skill_env

MANUAL_SESSION = [
    '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}',
    '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"my_tool","arguments":{"input":"test"}}}',
    '{"jsonrpc":"2.0","id":3,"method":"shutdown","params":{}}',
]


def test_the_manual_session(tmp_path: Path) -> None:
    """The manual session's three lines, with its tool's name replaced by one of ours."""
    lines = [MANUAL_SESSION[0], MANUAL_SESSION[1].replace("my_tool", "AID.ECHO.v1"), MANUAL_SESSION[2]]
    with LineClient([TOOLHOST, "--skill"], env=skill_env(tmp_path)) as c:
        for line in lines:
            c.send_raw(line)
        init = c.answer(1)["result"]
        assert init["name"] == "machina-toolhost" and init["version"] == md.__version__
        assert isinstance(init["description"], str) and init["description"]
        tools = {t["name"]: t for t in init["tools"]}
        assert set(tools["AID.TEXT.STATS.v1"]) == {"name", "description", "parameters"}
        assert tools["AID.TEXT.STATS.v1"]["parameters"]["required"] == ["text"]
        assert tools["AID.ECHO.v1"]["parameters"] == {"type": "object"}
        call = c.answer(2)["result"]
        assert call["content"] == '{"input":"test"}' and call["isError"] is False
        assert call["structuredContent"] == {"input": "test"}
        assert c.answer(3)["result"] == {"ok": True}
        # shutdown: it exits after the reply, though its input is still open.
        assert c.proc.wait(10) == 0
    # The answer to shutdown comes after every other.
    assert [json.loads(line)["id"] for line in iter(c.lines.get, None)][-1] == 3


def test_the_manual_tool_name_that_is_not_ours(tmp_path: Path) -> None:
    with LineClient([TOOLHOST, "--skill"], env=skill_env(tmp_path)) as c:
        for line in MANUAL_SESSION:
            c.send_raw(line)
        error = c.answer(2)["error"]
        assert error["code"] == -32602 and error["data"]["code"] == "tool_not_found"
        assert c.answer(3)["result"] == {"ok": True}


def test_lifecycle_methods_answer_ok_and_reach_the_hosts_own_skills(tmp_path: Path) -> None:
    inner = probe_skill(tmp_path)
    with LineClient([TOOLHOST, "--skill", "--tools", str(inner)], env=skill_env(tmp_path)) as c:
        for method in ("lifecycle/onLoad", "lifecycle/onTick", "skill/activate"):
            assert c.result(method, {}) == {"ok": True}
        assert c.result("lifecycle/onSessionStart", {"sessionId": "outer-1"}) == {"ok": True}
        assert c.result("lifecycle/onSessionEnd", {"sessionId": "outer-1"}) == {"ok": True}
        answer = c.request("nonsense/method", {})
        assert answer["error"]["code"] == -32601
        assert c.result("shutdown", {}) == {"ok": True}
        assert c.proc.wait(10) == 0
    sessions = [e["params"]["sessionId"] for e in probe_log(inner) if e["event"] == "lifecycle/onSessionStart"]
    assert "outer-1" in sessions


def test_a_host_hosts_a_host(tmp_path: Path) -> None:
    m = manifest(tmp_path, [("skill", {"name": "inner", "command": [TOOLHOST, "--skill"], "aid_prefix": "INNER."})])
    out = serve([{"aid": "INNER.AID_ECHO_V1.v1", "input_json": json.dumps({"a": [1, 2]})},
                 {"aid": "INNER.AID_ECHO_V1.v1", "input_json": "[3]"},
                 {"aid": "INNER.AID_TEXT_STATS_V1.v1", "input_json": json.dumps({"text": "x y"})},
                 {"aid": "INNER.AID_TEXT_STATS_V1.v1", "input_json": json.dumps({"text": 5})},
                 {"aid": "INNER.AID_FILE_READ_V1.v1", "input_json": json.dumps({"path": "not-here.txt"})}],
                "--tools", str(m), env=skill_env(tmp_path))
    assert json.loads(out[0]["output_json"]) == {"a": [1, 2]}
    # Arguments are an object (the skill protocol has no other): the inner host lists each of its
    # tools with an object schema at least, which the outer host checks.
    assert out[1]["code"] == "schema_violation" and "expected object" in out[1]["error"]
    assert json.loads(out[2]["output_json"])["words"] == 2
    assert out[3]["code"] == "schema_violation"  # the outer host checks the inner's schema itself
    assert out[4]["status"] == "TOOL_ERROR" and "not-here.txt" in out[4]["error"]


def test_the_skill_transport_over_a_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    with md.Skill([TOOLHOST, "--skill"], name="inner") as t:
        assert t.call("AID.ECHO.v1", {"x": 1}).output == {"x": 1}
        r: Any = t.call("AID.TEXT.STATS.v1", {"text": 5}, check=False)
        assert r.code == "schema_violation"
        with pytest.raises(md.ToolNotFound):
            t.call("AID.NOT.THERE.v1")


def test_skill_front_refuses_mcp_only_behaviour(tmp_path: Path) -> None:
    proc = subprocess.run([TOOLHOST, "--skill", "--mcp"], capture_output=True, timeout=30)
    assert proc.returncode == 2 and b"excludes" in proc.stderr
