"""Hosting skills (the skill protocol: JSON-RPC 2.0 child processes on stdio): registration from a skill
directory or a [[skill]] table, calls and their results, many calls in flight on one child,
the lifecycle methods, the skill's own requests (state/*, data/*), supervision (a crash,
garbage, a hang, a deadline, restarts with back-off, the stderr tail) and the limits a
skill's process runs under. The tests' skill is tests/skills/test_skill."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import machina_dispatch as md
import pytest
from conftest import HANG_GUARD_S, PAST_GUARD_MS, SANITIZED, TOOLHOST, most_at_once, scaled, serve
from jsonrpc_support import PYTHON, manifest, probe_log, probe_skill, skill_env, wait_for
from process_tree import alive

P = "AID.SKILL.PROBE."


@pytest.fixture
def skill_dir(tmp_path: Path) -> Path:
    return probe_skill(tmp_path)


@pytest.fixture
def skill(skill_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    t = md.Skill(skill_dir)
    yield t
    t.close()


def events(skill_dir: Path, name: str) -> list[dict[str, Any]]:
    return [e for e in probe_log(skill_dir) if e["event"] == name]


# --- registration and results -------------------------------------------------------------------


def test_a_skill_directory_registers_each_tool_under_an_aid_of_its_own(skill_dir: Path, tmp_path: Path) -> None:
    proc = subprocess.run([TOOLHOST, "--tools", str(skill_dir), "--list"], capture_output=True,
                          env=skill_env(tmp_path), timeout=60)
    assert proc.returncode == 0, proc.stderr
    tools = {t["aid"]: t for t in json.loads(proc.stdout)["tools"]}
    echo = tools[P + "ECHO.v1"]
    assert echo["name"] == "echo" and echo["runner"] == "skill"
    assert echo["description"] == "Its arguments, as text (the skill protocol's content string)"
    assert echo["input_schema"] == {"type": "object", "properties": {"text": {"type": "string"}}}
    assert P + "IS_ERROR.v1" in tools  # every character but letters and digits becomes '_'
    assert len([a for a in tools if a.startswith(P)]) == 18
    # Started to be asked, then told to leave: nothing left running.
    assert [e["event"] for e in probe_log(skill_dir)] == ["started", "lifecycle/onLoad", "shutdown", "exiting"]


def test_results_of_every_shape_map_to_output_json(skill: Any) -> None:
    assert skill.call("echo", {"text": "hi"}).output_json == json.dumps(json.dumps({"text": "hi"}))
    assert skill.call("blocks").output == [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    assert skill.call("structured", {"n": 7}).output == {"n": 7}  # structuredContent is preferred
    r = skill.call("is_error", check=False)
    assert (r.status, r.code, r.error) == ("TOOL_ERROR", "tool_error", "it went wrong")
    r = skill.call("fail", {"message": "nope"}, check=False)
    assert (r.code, r.error) == ("tool_error", "error -32603: nope")
    with pytest.raises(md.ToolFailed):
        skill.call("fail")
    # The host checks the input against the skill's schema before the skill sees it.
    r = skill.call("echo", {"text": 5}, check=False)
    assert r.code == "schema_violation" and "at /text" in r.error
    trace = skill.call("echo", {"text": "t"}).trace
    assert trace["runner"] == "skill" and trace["server"] == "probe" and trace["tool"] == "echo"
    assert alive(trace["child_pid"])


def test_many_calls_run_at_once_on_one_skill_process(skill: Any, skill_dir: Path) -> None:
    skill.call("sleep", {"ms": 1})  # warm
    results: list[Any] = []

    def one() -> None:
        results.append(skill.call("sleep", {"ms": 200, "stamps": True}))

    threads = [threading.Thread(target=one) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 16 and all(r.ok for r in results)
    most = most_at_once(r.output for r in results)
    assert most >= 4, f"at most {most} of 16 calls of 200 ms ran at once: not in flight together"
    assert len(events(skill_dir, "started")) == 1
    assert len({r.trace["child_pid"] for r in results}) == 1


# --- lifecycle ----------------------------------------------------------------------------------


def test_lifecycle_load_sessions_ticks_and_shutdown(skill_dir: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    t = md.Skill(skill_dir, tick_interval_ms=50)
    trace = t.call("echo").trace
    assert trace is not None
    pid = trace["child_pid"]
    wait_for(lambda: len(events(skill_dir, "lifecycle/onTick")) >= 3, what="three ticks")
    t.close()
    log = probe_log(skill_dir)
    names = [e["event"] for e in log]
    assert names[:3] == ["started", "lifecycle/onLoad", "lifecycle/onSessionStart"]
    assert names[-3:] == ["lifecycle/onSessionEnd", "shutdown", "exiting"]
    start, end = events(skill_dir, "lifecycle/onSessionStart"), events(skill_dir, "lifecycle/onSessionEnd")
    assert start[0]["params"]["sessionId"] == end[0]["params"]["sessionId"]
    assert not alive(pid)


def test_a_lifecycle_skill_is_ticked_by_default_unless_its_manifest_says_never(
        skill_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    with md.Skill(skill_dir, skill_tick_ms=50) as t:  # the host's default interval, shortened
        t.call("echo")
        wait_for(lambda: len(events(skill_dir, "lifecycle/onTick")) >= 2, what="ticks by default")
    before = len(events(skill_dir, "lifecycle/onTick"))
    with md.Skill(skill_dir, tick_interval_ms=0, skill_tick_ms=50) as t:
        t.call("echo")
        time.sleep(0.4)
    assert len(events(skill_dir, "lifecycle/onTick")) == before
    # The directory's own manifest.json may say never too.
    spec = json.loads((skill_dir / "manifest.json").read_text())
    (skill_dir / "manifest.json").write_text(json.dumps({**spec, "tick_interval": 0}))
    with md.Skill(skill_dir, skill_tick_ms=50) as t:
        t.call("echo")
        time.sleep(0.4)
    assert len(events(skill_dir, "lifecycle/onTick")) == before
    with pytest.raises(md.HostError, match="skill_tick_ms must be 0 to 86400000, not -1"):
        md.Skill(skill_dir, skill_tick_ms=-1)


def test_a_serve_stream_is_a_session(skill_dir: Path, tmp_path: Path) -> None:
    out = serve([{"aid": P + "ECHO.v1"}], "--tools", str(skill_dir), env=skill_env(tmp_path))
    assert out[0]["ok"], out
    names = [e["event"] for e in probe_log(skill_dir)]
    # (--serve loads the skill afresh: a second start after the one --tools' load began with)
    assert names[-5:] == ["lifecycle/onLoad", "lifecycle/onSessionStart", "lifecycle/onSessionEnd", "shutdown",
                          "exiting"]
    assert events(skill_dir, "lifecycle/onSessionStart")[0]["params"]["sessionId"].startswith("serve-")


def test_the_skill_runtimes_method_names(skill_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    data = tmp_path / "data"
    t = md.Skill([PYTHON, "skill.py"], cwd=skill_dir, name="probe", methods="skill", tick_interval_ms=50,
                 data_dir=data)
    assert t.call("echo", {"text": "x"}).ok
    wait_for(lambda: events(skill_dir, "skill/tick"), what="a tick")
    t.close()
    # (a tick may come between the session's end and the shutdown: ticks are not the session's)
    names = [e["event"] for e in probe_log(skill_dir) if e["event"] != "skill/tick"]
    assert names[:4] == ["started", "skill/load", "skill/activate", "skill/sessionStart"]
    assert names[-3:] == ["skill/sessionEnd", "skill/shutdown", "exiting"]
    assert events(skill_dir, "skill/load")[0]["params"]["dataDir"] == str(data)
    assert "lifecycle/onLoad" not in names


def test_lifecycle_methods_may_be_named(skill_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`methods = "lifecycle"`, the default, named: lifecycle/* and shutdown, no skill/*."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    with md.Skill([PYTHON, "skill.py"], cwd=skill_dir, name="probe", methods="lifecycle", tick_interval_ms=0) as t:
        assert t.call("echo", {"text": "x"}).ok
    names = [e["event"] for e in probe_log(skill_dir)]
    assert "lifecycle/onLoad" in names and names[-2:] == ["shutdown", "exiting"], names
    assert not [n for n in names if n.startswith("skill/")], names


# --- requests from the skill ------------------------------------------------------------------------


def test_state_requests_read_and_write_the_calls_ds_state(skill: Any) -> None:
    state = md.DsState({0: md.Artifact.of("note", {"n": 1})})
    r = skill.call("state", {"slot": 0, "put": 3}, state=state)
    got = r.output["get"]["result"]
    assert got["slot"] == "DS0" and json.loads(got["artifact"]["content_json"]) == {"n": 1}
    assert r.output["set"]["result"] == {"ok": True}
    assert state[3].type == "probe" and state[3].content == {"seen": r.output["get"]}
    assert state[3].provenance == "skill:probe"
    assert r.ds_delta.slots.keys() == {"DS3"}


def test_data_requests_stay_in_the_skills_data_directory(skill_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    m = manifest(tmp_path, [("skill", {"dir": str(skill_dir), "data_dir": str(data)})])
    out = serve([{"aid": P + "DATA.v1", "input_json": json.dumps({"path": "notes/a.txt", "content": "hello"})},
                 {"aid": P + "DATA.v1", "input_json": json.dumps({"path": "../escape.txt", "content": "x"})},
                 {"aid": P + "DATA.v1", "input_json": json.dumps({"path": "/etc/passwd", "content": "x"})}],
                "--tools", str(m), env=skill_env(tmp_path))
    first = json.loads(out[0]["output_json"])
    assert first["write"]["result"] == {"ok": True, "bytes": 5}
    assert first["read"]["result"] == {"exists": True, "content": "hello"}
    assert (data / "notes" / "a.txt").read_text() == "hello"
    for refused in out[1:]:
        answer = json.loads(refused["output_json"])
        assert answer["write"]["error"]["code"] == -32602 and "path refused" in answer["write"]["error"]["message"]
    assert not (tmp_path / "escape.txt").exists()


def test_other_requests_are_refused_never_left_hanging(skill: Any) -> None:
    for method in ("roots/list", "sampling/createMessage", "host/secrets"):
        answer = skill.call("ask", {"method": method}).output
        assert answer["error"]["code"] == -32601, answer
    assert skill.call("ask", {"method": "ping"}).output["result"] == {}
    # A method name that is not UTF-8 is refused like any other unknown one, and the skill
    # goes on serving.
    pid = skill.call("echo").trace["child_pid"]
    answer = skill.call("ask", {"method_hex": "ff41"}).output
    assert answer["error"]["code"] == -32601, answer
    again = skill.call("echo")
    assert again.ok and again.trace["child_pid"] == pid


# --- supervision ----------------------------------------------------------------------------------


def test_a_crash_costs_the_calls_in_flight_and_the_skill_is_started_again(skill: Any, skill_dir: Path) -> None:
    first = skill.call("echo").trace["child_pid"]
    r = skill.call("crash", check=False)
    assert r.code == "tool_crashed" and "exited with status 3" in r.error
    assert "probe: crashing on purpose" in r.error  # the tail of its stderr
    again = skill.call("echo")
    assert again.ok and again.trace["child_pid"] != first
    assert len(events(skill_dir, "started")) == 2
    # The sessions under way are told to the new process too.
    assert events(skill_dir, "lifecycle/onSessionStart")[-1]["pid"] == again.trace["child_pid"]


def test_garbage_on_the_pipe_fails_every_call_in_flight(skill: Any) -> None:
    results: list[Any] = []
    slow = threading.Thread(target=lambda: results.append(skill.call("sleep", {"ms": 3000}, check=False)))
    slow.start()
    time.sleep(0.3)
    r = skill.call("garbage", check=False)
    slow.join(10)
    assert r.code == "tool_crashed" and "not JSON" in r.error, r.error
    assert results and results[0].code == "tool_crashed", results
    assert skill.call("echo").ok


def test_an_answer_nested_past_the_limit_fails_the_call_and_the_host_lives_on(skill: Any) -> None:
    # RapidJSON's reader recurses: 300 000 brackets overflowed the stack of the process
    # hosting the skill before the parse counted its depth.
    r = skill.call("deep", {"n": 300_000}, check=False)
    assert r.code == "tool_crashed" and "nesting deeper than 512" in r.error, r.error
    assert skill.call("echo").ok


def test_a_call_past_its_deadline_is_answered_on_time_and_the_skill_told(skill: Any, skill_dir: Path) -> None:
    pid = skill.call("echo").trace["child_pid"]
    t0 = time.monotonic()
    r = skill.call("sleep", {"ms": PAST_GUARD_MS}, timeout=0.3, check=False)
    elapsed = time.monotonic() - t0
    assert r.code == "timeout" and 0.25 < elapsed < scaled(HANG_GUARD_S), (r.error, elapsed)
    assert "notifications/cancelled" in r.error
    cancelled = wait_for(lambda: events(skill_dir, "notifications/cancelled"), what="the cancellation")
    assert isinstance(cancelled[0]["params"]["requestId"], int) and cancelled[0]["params"]["reason"] == "timed out"
    # It still answers (a ping): it is not killed.
    time.sleep(0.3)
    assert skill.call("echo").trace["child_pid"] == pid and alive(pid)


def test_a_hung_skill_is_killed_and_replaced(skill: Any) -> None:
    pid = skill.call("echo").trace["child_pid"]
    t0 = time.monotonic()
    r = skill.call("hang", timeout=0.3, check=False)
    assert r.code == "timeout" and 0.25 < time.monotonic() - t0 < scaled(HANG_GUARD_S)
    wait_for(lambda: not alive(pid), timeout=10, what="the hung skill to be killed")
    assert skill.call("echo").trace["child_pid"] != pid


def test_restarts_back_off(skill_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A skill that cannot be started again is not started again at every call: the second
    failure in a row waits 100 ms, doubling with each one after."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    marker = tmp_path / "broken"
    starter = tmp_path / "start.py"
    starter.write_text(f"import os, runpy, sys\nif os.path.exists({str(marker)!r}): sys.exit('cannot start')\n"
                       "runpy.run_path('skill.py', run_name='__main__')\n")
    t = md.Skill([PYTHON, str(starter)], cwd=skill_dir, name="probe")
    try:
        marker.write_text("")
        assert t.call("crash", check=False).code == "tool_crashed"
        r1 = t.call("echo", check=False)
        assert r1.code == "tool_crashed" and "could not be started again" in r1.error and "cannot start" in r1.error
        r2 = t.call("echo", check=False)
        assert r2.code == "tool_crashed" and "is started again in" in r2.error, r2.error
        marker.unlink()
        time.sleep(0.25)
        assert t.call("echo").ok
    finally:
        t.close()


def test_the_stderr_tail_is_bounded(skill_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    noisy = tmp_path / "noisy.py"
    noisy.write_text("import runpy, sys\nsys.stderr.write('x' * 100000 + 'THE END\\n')\nsys.stderr.flush()\n"
                     "runpy.run_path('skill.py', run_name='__main__')\n")
    t = md.Skill([PYTHON, str(noisy)], cwd=skill_dir, name="probe")
    try:
        r = t.call("crash", check=False)
        assert "probe: crashing on purpose" in r.error and len(r.error) < 5000
    finally:
        t.close()


def test_an_answer_over_the_output_cap(skill: Any, skill_dir: Path, tmp_path: Path) -> None:
    out = serve([{"aid": P + "BIG.v1", "input_json": '{"n": 5000}'}, {"aid": P + "BIG.v1", "input_json": '{"n": 10}'}],
                "--tools", str(skill_dir), "--max-output-bytes", "1000", env=skill_env(tmp_path))
    assert out[0]["code"] == "output_too_large", out[0]
    assert out[1]["ok"]


# --- the skill's process ----------------------------------------------------------------------------


def test_only_named_environment_variables_reach_a_skill(skill_dir: Path, tmp_path: Path) -> None:
    m = manifest(tmp_path, [("skill", {"dir": str(skill_dir), "env": ["PROBE_PASSED"]})])
    out = serve([{"aid": P + "ENV.v1"}], "--tools", str(m),
                env=skill_env(tmp_path, {"PROBE_PASSED": "1", "PROBE_SECRET": "2"}))
    names = json.loads(out[0]["output_json"])["names"]
    assert "PROBE_PASSED" in names and "PROBE_SECRET" not in names and "PATH" in names


@pytest.mark.parametrize("how", ["guarantee", "host option", "none"])
def test_no_network_applies_to_the_skills_process(how: str, skill_dir: Path, tmp_path: Path) -> None:
    fields: dict[str, Any] = {"dir": str(skill_dir)}
    args: list[str] = []
    if how == "guarantee":
        fields["guarantees"] = {"no_network": True}
    elif how == "host option":
        args = ["--no-network", "--isolation", "process"]  # (the host's OS limits need process isolation)
    m = manifest(tmp_path, [("skill", fields)])
    out = serve([{"aid": P + "NET.v1"}], "--tools", str(m), *args, env=skill_env(tmp_path))
    answer = json.loads(out[0]["output_json"])
    assert answer.startswith("refused") if how != "none" else answer == "allowed", answer


def test_host_os_limits_apply_to_the_skills_process(skill_dir: Path, tmp_path: Path) -> None:
    m = manifest(tmp_path, [("skill", {"dir": str(skill_dir)})])
    request = {"aid": P + "LIMITS.v1"}
    # (Under ASan no address-space limit: its shadow memory needs terabytes of address space,
    # and the isolated workers are ASan builds too.)
    memory = [] if SANITIZED else ["--limit-memory-mb", "4096"]
    limited = serve([request], "--tools", str(m), "--isolation", "process", "--limit-open-files", "64", *memory,
                    "--limit-file-size-mb", "8", env=skill_env(tmp_path))
    got = json.loads(limited[0]["output_json"])
    assert (got["nofile"], got["fsize"]) == (64, 8 << 20) and (SANITIZED or got["as"] == 4096 << 20), got
    unlimited = json.loads(serve([request], "--tools", str(m), env=skill_env(tmp_path))[0]["output_json"])
    assert unlimited["as"] != 4096 << 20 and unlimited["fsize"] != 8 << 20


# --- what a manifest says -----------------------------------------------------------------------------


@pytest.mark.parametrize("fields,message", [
    ({"name": "x"}, "'command': is required"),
    ({"name": "x", "command": ["no-such-program-here"]}, "not found on PATH"),
    ({"name": "x", "command": [sys.executable, "-c", "import time; time.sleep(30)"], "start_timeout_ms": 300},
     "initialize failed: no answer within 300 ms"),
    ({"name": "x", "command": [sys.executable, "-c", "print('hello')"]}, "initialize failed"),
    ({"name": "x", "command": [sys.executable, "-c",
                               "import json,sys\nfor l in sys.stdin:\n i=json.loads(l).get('id')\n"
                               " if i is not None: print(json.dumps({'jsonrpc':'2.0','id':i,'result':{'tools':[]}}),"
                               " flush=True)"]},
     "it offers no tools"),
    ({"name": "x", "command": [sys.executable], "guarantees": {"no_filesystem_read": True}},
     "no_filesystem_read is not offered"),
    ({"name": "x", "command": [sys.executable], "methods": "other"}, "'methods'"),
    ({"name": "x", "command": [sys.executable], "methods": "seed"}, '"seed" is spelled "lifecycle"'),
])
def test_bad_skill_entries_are_refused_by_name(fields: dict[str, Any], message: str, tmp_path: Path) -> None:
    m = manifest(tmp_path, [("skill", fields)])
    proc = subprocess.run([TOOLHOST, "--tools", str(m), "--list"], capture_output=True, env=skill_env(tmp_path),
                          timeout=60)
    assert proc.returncode == 2
    assert message in proc.stderr.decode() and "tools.toml:" in proc.stderr.decode(), proc.stderr


def test_a_failed_load_leaves_nothing_running(skill_dir: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """All or none: a manifest whose second entry fails stops the skill its first started."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    m = manifest(tmp_path, [("skill", {"dir": str(skill_dir)}),
                            ("skill", {"name": "broken", "command": ["no-such-program-here"]})])
    with pytest.raises(md.HostError, match="skill broken"):
        md.InProcess(plugins=[], tools=[m])
    started = events(skill_dir, "started")
    assert len(started) == 1 and not alive(started[0]["pid"])
    assert events(skill_dir, "exiting")


def test_the_skill_process_ends_with_the_host(skill_dir: Path, tmp_path: Path) -> None:
    proc = subprocess.Popen([TOOLHOST, "--tools", str(skill_dir), "--serve"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=skill_env(tmp_path))
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps({"aid": P + "ECHO.v1"}).encode() + b"\n")
    proc.stdin.flush()
    pid = json.loads(proc.stdout.readline())["trace"]["child_pid"]
    proc.kill()
    proc.wait()
    wait_for(lambda: not alive(pid), what="the skill to die with its host")


def test_skill_data_defaults_beneath_the_state_directory(skill_dir: Path, tmp_path: Path) -> None:
    out = serve([{"aid": P + "DATA.v1", "input_json": json.dumps({"path": "f.txt", "content": "v"})}],
                "--tools", str(skill_dir), env=skill_env(tmp_path))
    assert out[0]["ok"]
    assert (tmp_path / "state" / "machina-toolhost" / "skills" / "probe" / "f.txt").read_text() == "v"


# --- the example skill (docs/example_skill) ---------------------------------------------------------------


def test_the_example_skill_as_its_guide_shows(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parent.parent / "docs" / "example_skill"
    n = "AID.SKILL.NOTEBOOK."
    out = serve([{"id": 1, "aid": n + "NOTE_WRITE.v1", "input_json": json.dumps({"name": "todo", "text": "buy milk"})},
                 {"id": 2, "aid": n + "NOTE_READ.v1", "input_json": json.dumps({"name": "todo"})},
                 {"id": 3, "aid": n + "REMEMBER.v1", "input_json": json.dumps({"slot": 2, "text": "hi"})},
                 {"id": 4, "aid": n + "NOTE_READ.v1", "input_json": json.dumps({"name": "none"})},
                 {"id": 5, "aid": n + "COUNT_WORDS.v1", "input_json": json.dumps({"text": "a b c"})},
                 {"id": 6, "aid": n + "NOTE_WRITE.v1", "input_json": json.dumps({"name": "../x", "text": "y"})}],
                "--tools", str(example), env=skill_env(tmp_path))
    assert [json.loads(r["output_json"]) if r["ok"] else r["error"] for r in out] == [
        "kept todo", "buy milk", "remembered in DS2", "no note named none", {"words": 3},
        "error -32603: not a note name: '../x'"]
    assert out[2]["ds_state"]["slots"]["DS2"]["content_json"] == '"hi"'
    notes = tmp_path / "state" / "machina-toolhost" / "skills" / "notebook" / "notes"
    assert (notes / "todo.txt").read_text() == "buy milk"
    # By hand, as the skill protocol's Testing section does: answers to the three lines, in order.
    lines = [{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
             {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
              "params": {"name": "count_words", "arguments": {"text": "a b c"}}},
             {"jsonrpc": "2.0", "id": 3, "method": "shutdown", "params": {}}]
    hand = subprocess.run([sys.executable, "skill.py"], cwd=example, capture_output=True, timeout=30,
                          input="".join(json.dumps(m) + "\n" for m in lines).encode())
    answers = [json.loads(line) for line in hand.stdout.splitlines()]
    assert [a["id"] for a in answers] == [1, 2, 3] and hand.returncode == 0
    assert answers[1]["result"]["structuredContent"] == {"words": 3}
