"""Hosting MCP servers ([[mcp_server]]): a server written on the official MCP Python SDK is
started, its tools listed (following tools/list cursors) and registered, its results mapped
(structuredContent preferred, isError as TOOL_ERROR), and it is supervised like a skill (a
deadline cancels the handler, a crash is answered and the server started again)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import machina_dispatch as md
import pytest
from conftest import HANG_GUARD_S, PAST_GUARD_MS, TOOLHOST, most_at_once, scaled
from jsonrpc_support import manifest, mcp_server_command, skill_env, wait_for
from process_tree import alive

P = "AID.MCP.SDK."


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("CANCEL_LOG", str(tmp_path / "cancelled.log"))
    t = md.Mcp(mcp_server_command(), name="sdk", env=["CANCEL_LOG"])
    yield t
    t.close()


def test_its_tools_are_registered_with_what_it_says_of_them(tmp_path: Path) -> None:
    m = manifest(tmp_path, [("mcp_server", {"name": "sdk", "command": mcp_server_command()})])
    proc = subprocess.run([TOOLHOST, "--tools", str(m), "--list"], capture_output=True, env=skill_env(tmp_path),
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    tools = {t["aid"]: t for t in json.loads(proc.stdout)["tools"] if t["aid"].startswith(P)}
    assert set(tools) == {P + n + ".v1" for n in ("ADD", "REVERSE", "WORDS", "FAIL", "SLOW", "SLEEP_STAMPED",
                                                           "CRASH", "ENV")}
    add = tools[P + "ADD.v1"]
    assert add["runner"] == "mcp" and add["name"] == "add" and add["title"] == "Adder"
    assert add["description"] == "Adds two integers."
    assert add["input_schema"]["required"] == ["a", "b"]
    assert add["output_schema"]["required"] == ["sum", "inputs"]
    assert add["annotations"] == {"readOnlyHint": True, "idempotentHint": True}


def test_results_structured_content_first_and_errors(server: Any) -> None:
    assert server.call("add", {"a": 2, "b": 40}).output == {"sum": 42, "inputs": [2, 40]}
    assert server.call("reverse", {"text": "abc"}).output == {"result": "cba"}
    assert server.call("words", {"text": "a b"}).output == {"result": ["a", "b"]}
    r = server.call("fail", {"message": "no"}, check=False)
    assert (r.status, r.code, r.error) == ("TOOL_ERROR", "tool_error", "Error executing tool fail")
    # The host checks arguments against the server's schema first.
    r = server.call("add", {"a": "two", "b": 1}, check=False)
    assert r.code == "schema_violation"


def test_tools_list_is_followed_page_by_page(tmp_path: Path) -> None:
    t = md.Mcp(mcp_server_command("paged_server.py"), name="paged")
    try:
        assert sorted(t.tools) == ["t0", "t1", "t2", "t3", "t4"]
        assert t.call("t3").output == "called t3"
    finally:
        t.close()


def test_calls_run_at_once_on_one_server(server: Any) -> None:
    server.call("reverse", {"text": "warm"})
    results: list[Any] = []
    threads = [threading.Thread(target=lambda: results.append(server.call("sleep_stamped", {"seconds": 0.3})))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.ok for r in results) and len(results) == 8
    assert most_at_once(r.output for r in results) >= 2, results  # in flight together, not one at a time


def test_a_deadline_cancels_the_servers_handler(server: Any, tmp_path: Path) -> None:
    t0 = time.monotonic()
    seconds = PAST_GUARD_MS / 1000
    r = server.call("slow", {"seconds": seconds}, timeout=0.5, check=False)
    assert r.code == "timeout" and 0.5 <= time.monotonic() - t0 < scaled(HANG_GUARD_S)
    assert wait_for(lambda: (tmp_path / "cancelled.log").exists() and
                    (tmp_path / "cancelled.log").read_text()) == f"slow({seconds}) cancelled\n"
    assert server.call("reverse", {"text": "ok"}).output == {"result": "ko"}


def test_a_crashed_server_is_started_again(server: Any) -> None:
    pid = server.call("reverse", {"text": "x"}).trace["child_pid"]
    r = server.call("crash", check=False)
    assert r.code == "tool_crashed" and "sdk-tests: exiting on purpose" in r.error, r.error
    assert not alive(pid)
    again = server.call("reverse", {"text": "y"})
    assert again.ok and again.trace["child_pid"] != pid


def test_the_server_gets_only_the_environment_it_is_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_OF_THE_HOST", "x")
    monkeypatch.setenv("GIVEN_TO_IT", "y")
    t = md.Mcp(mcp_server_command(), name="sdk", env=["GIVEN_TO_IT"])
    try:
        names = t.call("env").output["names"]
        assert "GIVEN_TO_IT" in names and "SECRET_OF_THE_HOST" not in names
    finally:
        t.close()


def test_a_server_that_is_not_one_is_refused(tmp_path: Path) -> None:
    with pytest.raises(md.HostError, match=r"mcp_server x: server/discover failed"):
        md.Mcp(["python3", "-c", "print('no')"], name="x")
    with pytest.raises(md.HostError, match="no answer within 300 ms"):
        md.Mcp(["python3", "-c", "import time; time.sleep(20)"], name="x", start_timeout=0.3)
