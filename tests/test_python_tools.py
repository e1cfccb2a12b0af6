"""Python tools through the host (issue: Python tools and HTTP tool services): tools from a
TOML manifest are listed and go through every host rule; the Python runner speaks tool
protocol v1 exactly as its own one-shot runner; workers are warm (imported once,
reloaded on change), supervised (a crash, a hang or a leak costs one call) and run calls
concurrently; each call's trace says what ran it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import machina_dispatch as md
import process_tree
import pytest
from conftest import HANG_GUARD_S, LEASE_SECRET, TOOLHOST, base_env, most_at_once, run_json, scaled, serve
from python_support import LITERAL_RUNNER, call, python_tool, write_pack

GREET = python_tool("AID.PY.GREET.v1", "tools.sample_tool:greet", description="Greets someone",
                    input_schema={"type": "object", "required": ["name"],
                                  "properties": {"name": {"type": "string"}}})


def pack(tmp_path: Path, *tools: dict[str, Any]) -> str:
    return str(write_pack(tmp_path / "pack", list(tools)))


def trace_of(response: dict[str, Any]) -> dict[str, Any]:
    trace = response.get("trace")
    assert isinstance(trace, dict), response
    return trace


# --- the manifest -------------------------------------------------------------------------


def test_manifest_tools_are_listed_beside_plugin_tools(tmp_path: Path) -> None:
    manifest = pack(tmp_path, {**GREET, "tier": 1, "timeout_ms": 1500, "deterministic": True},
                    python_tool("AID.PY.WHO.v1", "tools.sample_tool:whoami"))
    proc = subprocess.run([TOOLHOST, "--tools", manifest, "--list"], capture_output=True, env=base_env(),
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    tools = {t["aid"]: t for t in json.loads(proc.stdout)["tools"]}
    assert "AID.ECHO.v1" in tools and tools["AID.ECHO.v1"]["runner"] == "inline"  # the built-in pack too
    greet = tools["AID.PY.GREET.v1"]
    assert (greet["runner"], greet["tier"], greet["timeout_ms"], greet["deterministic"]) == ("python", 1, 1500, True)
    assert greet["description"] == "Greets someone" and greet["input_schema"]["required"] == ["name"]
    assert greet["plugin"] == manifest
    assert tools["AID.PY.WHO.v1"]["runner"] == "python"
    with md.InProcess(tools=[manifest]) as host:
        assert {t["aid"] for t in host.host.list_tools()} == set(tools)


@pytest.mark.parametrize(("tool", "expected"), [
    ({"aid": "AID.X.v1", "runner": "python", "entry": "tools.sample_tool:greet", "colour": "red"},
     r"tools\.toml:5: tool 1 \(AID\.X\.v1\): unknown field 'colour'"),
    ({"aid": "AID.X.v1", "runner": "python", "entry": "tools.sample_tool:greet", "sandbox": "yes"},
     r"tools\.toml:5: tool 1 \(AID\.X\.v1\): field 'sandbox': must be a boolean, not a string"),
    ({"aid": "AID.X.v1", "runner": "python"}, r"tools\.toml:\d+: tool 1 \(AID\.X\.v1\): field 'entry': is required"),
    ({"aid": "AID.X.v1", "runner": "python", "entry": "tools.sample_tool:greet", "python": "no-such-python-3"},
     r"tools\.toml:\d: tool 1 \(AID\.X\.v1\): field 'python': 'no-such-python-3' was not found on PATH"),
    ({"aid": "AID.X.v1", "runner": "python", "entry": "tools.sample_tool:greet",
      "guarantees": {"no_teleport": True}},
     r"tools\.toml:5: tool 1 \(AID\.X\.v1\): field 'guarantees': unknown guarantee 'no_teleport'"),
])
def test_a_bad_manifest_is_refused_naming_file_line_and_field(tmp_path: Path, tool: dict[str, Any],
                                                              expected: str) -> None:
    manifest = pack(tmp_path, tool)
    proc = subprocess.run([TOOLHOST, "--tools", manifest, "--serve"], input=b"", capture_output=True,
                          env=base_env(), timeout=60)
    assert proc.returncode == 2 and proc.stdout == b""
    assert re.search(expected, proc.stderr.decode()), proc.stderr
    for make in (lambda: md.InProcess(tools=[manifest]), lambda: md.Pool(tools=[manifest]),
                 lambda: md.Spawn(tools=[manifest])):
        with pytest.raises(md.HostError, match=expected):
            make()


def test_an_aid_already_registered_is_refused(tmp_path: Path) -> None:
    manifest = pack(tmp_path, python_tool("AID.ECHO.v1", "tools.sample_tool:greet"))
    proc = subprocess.run([TOOLHOST, "--tools", manifest, "--list"], capture_output=True, env=base_env(), timeout=60)
    assert proc.returncode == 2
    assert f"tool manifest {manifest}: duplicate aid AID.ECHO.v1" in proc.stderr.decode()


def test_modules_resolve_from_the_manifests_own_directory(tmp_path: Path) -> None:
    manifest = pack(tmp_path, GREET)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.run([TOOLHOST, "--tools", os.path.relpath(manifest, elsewhere), "--run", "AID.PY.GREET.v1"],
                          input=json.dumps({"input_json": json.dumps({"name": "Ada"})}).encode(),
                          capture_output=True, env=base_env(), cwd=elsewhere, timeout=60)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["ok"] and json.loads(r["output_json"]) == {"message": "Hello Ada", "ok": True}


# --- protocol v1, exactly -----------------------------------------------------------------

CASES = [("greet", {"name": "Ada"}), ("greet", {}), ("blocked", {}), ("money", {})]


def test_a_tool_for_the_original_runner_answers_the_same_through_the_host(tmp_path: Path) -> None:
    tools = [python_tool(f"AID.PY.{i}.v1", f"tools.sample_tool:{fn}") for i, (fn, _) in enumerate(CASES)]
    manifest = pack(tmp_path, *tools)
    responses = serve([call(f"AID.PY.{i}.v1", payload) for i, (_, payload) in enumerate(CASES)],
                      "--tools", manifest)
    for (fn, payload), r in zip(CASES, responses, strict=True):
        request = json.dumps({"protocol_version": 1, "tool": fn, "entry": f"tools.sample_tool:{fn}",
                              "payload": payload}).encode()
        literal = json.loads(subprocess.run([sys.executable, "-c", LITERAL_RUNNER], input=request,
                                            capture_output=True, cwd=tmp_path / "pack", timeout=60,
                                            check=True).stdout)
        trace = trace_of(r)
        if literal["ok"]:
            assert r["ok"] and json.loads(r["output_json"]) == literal["result"], (fn, r)
        else:
            err = literal["error"]
            assert (r["ok"], r["status"], r["code"]) == (False, "TOOL_ERROR", "tool_error")
            assert r["error"] == f"{err['type']}: {err['message']}"
            assert (trace["error_type"], trace["error_message"]) == (err["type"], err["message"])
            assert trace.get("reason_code") == err.get("reason_code")
    assert json.loads(responses[3]["output_json"]) == {"whole": 3, "part": "2.5"}
    assert trace_of(responses[2])["reason_code"] == "guarantee_blocked"


def test_an_entry_its_module_does_not_define_is_refused_when_the_manifest_loads(tmp_path: Path) -> None:
    # (tool protocol v1 itself finds it at the call: AttributeError; the host says so at load)
    manifest = pack(tmp_path, python_tool("AID.PY.OK.v1", "tools.sample_tool:greet"),
                    python_tool("AID.PY.NO.v1", "tools.sample_tool:nothere"))
    proc = subprocess.run([TOOLHOST, "--tools", manifest, "--list"], capture_output=True, text=True, env=base_env(),
                          timeout=60)
    assert proc.returncode != 0
    assert "tool 2 (AID.PY.NO.v1): field 'entry': tools/sample_tool.py defines no 'nothere'" in proc.stderr
    with pytest.raises(md.HostError, match="defines no 'nothere'"):
        md.InProcess(tools=[manifest])
    (tmp_path / "pack" / "tools" / "broken.py").write_text("def f(:\n")
    broken = pack(tmp_path, python_tool("AID.PY.BAD.v1", "tools.broken:f"))
    proc = subprocess.run([TOOLHOST, "--tools", broken, "--list"], capture_output=True, text=True, env=base_env(),
                          timeout=60)
    assert proc.returncode != 0 and "field 'entry': tools/broken.py line 1: invalid syntax" in proc.stderr


def test_what_a_tool_prints_is_in_the_trace_and_never_in_the_stream(tmp_path: Path) -> None:
    manifest = pack(tmp_path, python_tool("AID.PY.NOISY.v1", "tools.sample_tool:noisy"), GREET)
    proc = subprocess.run([TOOLHOST, "--tools", manifest, "--serve"], capture_output=True, env=base_env(),
                          input=b"".join(json.dumps(r).encode() + b"\n" for r in
                                         [call("AID.PY.NOISY.v1", {"n": 1}), call("AID.PY.GREET.v1", {"name": "B"})]),
                          timeout=60)
    responses = [json.loads(line) for line in proc.stdout.splitlines()]  # every line a response
    assert [r["ok"] for r in responses] == [True, True]
    assert trace_of(responses[0])["stdout"] == "to stdout\n" and trace_of(responses[0])["stderr"] == "to stderr\n"
    assert trace_of(responses[1])["stdout"] == "greeting B\n"
    assert b"straight to descriptor 1" not in proc.stdout


# --- every host rule, unchanged -----------------------------------------------------------


def test_host_rules_apply_to_python_tools(tmp_path: Path) -> None:
    runs = tmp_path / "runs.txt"
    manifest = pack(tmp_path, GREET, python_tool("AID.PY.COUNT.v1", "tools.sample_tool:counter", tier=1),
                    python_tool("AID.PY.BIG.v1", "tools.sample_tool:big"),
                    python_tool("AID.PY.CRASH.v1", "tools.sample_tool:crash"))
    token, again = (md.issue_lease("AID.PY.COUNT.v1", 60, secret=LEASE_SECRET) for _ in range(2))
    count = {"file": str(runs)}
    env = {"MACHINA_LEASE_ENFORCE": "1", "MACHINA_LEASE_SECRET": LEASE_SECRET,
           "MACHINA_LEASE_LEDGER": str(tmp_path / "ledger")}
    r = serve([call("AID.PY.COUNT.v1", count),                                             # lease_required
               call("AID.PY.COUNT.v1", count, _lease_token=token, idempotency_key="k"),    # runs
               call("AID.PY.COUNT.v1", count, _lease_token=again, idempotency_key="k"),    # a hit
               call("AID.PY.GREET.v1", {"name": 5}),                                       # schema
               call("AID.PY.BIG.v1", {"n": 500}),                                          # output cap
               *[call("AID.PY.CRASH.v1")] * 3],                                            # breaker
              "--tools", manifest, "--max-output-bytes", "200", "--breaker-threshold", "2", env=env)
    assert (r[0]["code"], r[0]["tier"], r[0]["aid"]) == ("lease_required", 1, "AID.PY.COUNT.v1")
    assert r[1]["ok"] and json.loads(r[1]["output_json"]) == {"runs": 1}
    assert r[2]["ok"] and r[2]["idempotent_hit"] and r[2]["output_json"] == r[1]["output_json"]
    assert runs.read_text() == "1"  # the hit did not run the tool again
    assert (r[3]["status"], r[3]["code"]) == ("INVALID_PICK", "schema_violation") and "trace" not in r[3]
    assert r[4]["code"] == "output_too_large"
    assert [x["code"] for x in r[5:]] == ["tool_crashed", "tool_crashed", "breaker_open"]
    assert r[7]["status"] == "BREAKER_TRIP"


# --- warm, supervised workers -------------------------------------------------------------


def test_a_worker_imports_once_and_reloads_a_changed_module(tmp_path: Path) -> None:
    manifest = pack(tmp_path, python_tool("AID.PY.WHO.v1", "tools.sample_tool:whoami"))
    source = tmp_path / "pack" / "tools" / "sample_tool.py"
    with md.InProcess(tools=[manifest]) as host:
        first = [host.call("AID.PY.WHO.v1") for _ in range(3)]
        assert len({r.output["pid"] for r in first}) == 1  # one warm worker
        assert len({r.output["imported_at"] for r in first}) == 1  # imported once
        assert [r.output["calls"] for r in first] == [1, 2, 3]
        assert all("module_reloaded" not in (r.trace or {}) for r in first)
        source.write_text(source.read_text().replace('"calls": CALLS["n"]', '"calls": -CALLS["n"]'))
        stamp = time.time() + 5
        os.utime(source, (stamp, stamp))  # a new mtime even on a coarse clock
        changed = host.call("AID.PY.WHO.v1")
        assert changed.trace is not None and changed.trace["module_reloaded"] is True
        assert changed.output["pid"] == first[0].output["pid"]  # reloaded, not recycled
        assert changed.output["calls"] == -1 and changed.output["imported_at"] > first[0].output["imported_at"]


@pytest.mark.parametrize(("entry", "how", "said"), [
    ("crash", "exited with status 3", "about to exit 3"),
    ("segfault", "killed by signal 11 (SIGSEGV", "about to crash"),
])
def test_a_crash_costs_its_call_only(tmp_path: Path, no_orphans: None, entry: str, how: str, said: str) -> None:
    manifest = pack(tmp_path, python_tool("AID.PY.BAD.v1", f"tools.sample_tool:{entry}"),
                    python_tool("AID.PY.WHO.v1", "tools.sample_tool:whoami"))
    r = serve([call("AID.PY.WHO.v1"), call("AID.PY.BAD.v1"), call("AID.PY.WHO.v1")], "--tools", manifest)
    assert r[0]["ok"] and r[2]["ok"]
    assert (r[1]["status"], r[1]["code"]) == ("TOOL_ERROR", "tool_crashed")
    assert how in r[1]["error"] and said in r[1]["error"]  # how it ended, and its stderr's tail
    before, after = json.loads(r[0]["output_json"]), json.loads(r[2]["output_json"])
    assert before["pid"] != after["pid"] and after["calls"] == 1  # a fresh worker took over
    assert trace_of(r[1])["worker_pid"] == before["pid"]


def test_a_hang_is_answered_on_time_and_its_whole_process_group_killed(tmp_path: Path, no_orphans: None) -> None:
    pidfile = tmp_path / "child.pid"
    manifest = pack(tmp_path, python_tool("AID.PY.HANG.v1", "tools.sample_tool:hang"),
                    python_tool("AID.PY.WHO.v1", "tools.sample_tool:whoami"))
    with md.Pool(tools=[manifest], env=base_env()) as pool:
        warm = pool.call("AID.PY.WHO.v1")  # (its worker says which environment the interpreter is)
        started = time.monotonic()
        r = pool.call("AID.PY.HANG.v1", {"pidfile": str(pidfile)}, timeout=0.7, check=False)
        elapsed = time.monotonic() - started
        assert (r.code, r.kind) == ("timeout", "timeout") and "was killed and replaced" in r.error
        assert 0.6 < elapsed < scaled(HANG_GUARD_S)
        child = int(pidfile.read_text())
        deadline = time.monotonic() + 5
        while process_tree.alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not process_tree.alive(child), "the tool's child outlived its worker"
        answered = pool.call("AID.PY.WHO.v1")
        assert answered.output["calls"] == 1
        # The killed worker said nothing: the host names the interpreter's environment as its
        # workers reported it.
        assert r.trace is not None and answered.trace is not None and warm.trace is not None
        assert r.trace["python_env"] == warm.trace["python_env"] == answered.trace["python_env"]


@pytest.mark.parametrize("sandbox", [False, True])
def test_a_worker_past_its_memory_cap_is_replaced(tmp_path: Path, sandbox: bool) -> None:
    manifest = pack(tmp_path, python_tool("AID.PY.LEAK.v1", "tools.sample_tool:leak", memory_mb=96, sandbox=sandbox))
    r = serve([call("AID.PY.LEAK.v1", {"mb": 8}), call("AID.PY.LEAK.v1", {"mb": 150}),
               call("AID.PY.LEAK.v1", {"mb": 8})], "--tools", manifest)
    assert r[0]["ok"] and json.loads(r[0]["output_json"]) == {"kept_mb": 8}
    assert r[1]["code"] == "tool_crashed" and "memory cap of 96 MiB" in r[1]["error"]
    assert r[2]["ok"] and json.loads(r[2]["output_json"]) == {"kept_mb": 8}  # a fresh worker


def test_workers_run_calls_side_by_side(tmp_path: Path) -> None:
    manifest = pack(tmp_path, python_tool("AID.PY.SLEEP.v1", "tools.sample_tool:sleep", workers=3))
    r = serve([call("AID.PY.SLEEP.v1", {"s": 0.6, "stamps": True}, id=i) for i in range(3)], "--tools", manifest,
              "--workers", "3")
    assert all(x["ok"] for x in r)
    outputs = [json.loads(x["output_json"]) for x in r]
    assert len({o["pid"] for o in outputs}) == 3
    assert most_at_once(outputs) >= 2, outputs  # not 3 x 0.6 s one after another


def test_a_call_queued_behind_another_past_its_deadline_never_runs(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    manifest = pack(tmp_path, python_tool("AID.PY.SLEEP.v1", "tools.sample_tool:sleep", workers=1))
    with md.InProcess(tools=[manifest]) as host:
        first: list[md.ToolResult] = []
        runner = threading.Thread(target=lambda: first.append(host.call(
            "AID.PY.SLEEP.v1", {"s": 1.0, "mark": str(marks / "first"), "started": str(marks / "begun")}, timeout=10)))
        runner.start()
        deadline = time.monotonic() + 10
        while not (marks / "begun").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        # The one worker is busy: this call waits in its queue past its deadline.
        second = host.call("AID.PY.SLEEP.v1", {"s": 0, "mark": str(marks / "second")}, timeout=0.3, check=False)
        runner.join()
    assert first[0].ok
    assert second.code == "timeout" and "never started" in second.error
    assert (marks / "first").exists() and not (marks / "second").exists()  # skipped by the worker


def test_two_interpreters_side_by_side(tmp_path: Path) -> None:
    base = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    if sys.prefix == sys.base_prefix or not base.exists():
        pytest.skip("needs a virtual environment and its base interpreter")
    manifest = pack(tmp_path, python_tool("AID.PY.VENV.v1", "tools.sample_tool:whoami", python=sys.executable),
                    python_tool("AID.PY.BASE.v1", "tools.sample_tool:whoami", python=str(base)))
    with md.InProcess(tools=[manifest]) as host:
        venv, plain = host.call("AID.PY.VENV.v1"), host.call("AID.PY.BASE.v1")
    assert venv.output["prefix"] == sys.prefix and plain.output["prefix"] == sys.base_prefix
    assert venv.output["pid"] != plain.output["pid"]
    assert venv.trace is not None and plain.trace is not None
    assert (venv.trace["python_env"], plain.trace["python_env"]) == (sys.prefix, sys.base_prefix)


def test_no_worker_outlives_a_killed_host(tmp_path: Path) -> None:
    manifest = pack(tmp_path, python_tool("AID.PY.WHO.v1", "tools.sample_tool:whoami", workers=2))
    host = subprocess.Popen([TOOLHOST, "--tools", manifest, "--serve", "--workers", "2"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=base_env())
    try:
        assert host.stdin is not None and host.stdout is not None
        host.stdin.write(json.dumps(call("AID.PY.WHO.v1")).encode() + b"\n")
        host.stdin.flush()
        worker = json.loads(json.loads(host.stdout.readline())["output_json"])["pid"]
        assert process_tree.alive(worker)
    finally:
        host.send_signal(signal.SIGKILL)
        host.wait()
    deadline = time.monotonic() + 5
    while process_tree.alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process_tree.alive(worker)


# --- the trace, from every front ----------------------------------------------------------

TRACE_FIELDS = {"runner", "resolved_source", "timeout_ms", "duration_ms", "protocol_version", "python_env",
                "python_path", "deps_source", "sandbox", "trace_id", "enforcement_level", "stdout", "stderr",
                "worker_pid"}


def check_trace(trace: dict[str, Any] | None, trace_id: str | None = None, timeout_ms: int = 10_000) -> None:
    """`timeout_ms`: the tool's own deadline (tool protocol v1's 10 s), or the one the call sent."""
    assert trace is not None
    assert TRACE_FIELDS <= set(trace), TRACE_FIELDS - set(trace)
    assert (trace["runner"], trace["resolved_source"], trace["protocol_version"]) == ("local", "binding", 1)
    assert trace["timeout_ms"] == timeout_ms and trace["duration_ms"] > 0 and trace["sandbox"] is False
    assert trace["python_env"] == sys.prefix and trace["enforcement_level"] == "none"
    assert trace["deps_source"] == "none"  # the test pack's folder declares no dependencies
    if trace_id is None:
        uuid.UUID(trace["trace_id"])  # a fresh one
    else:
        assert trace["trace_id"] == trace_id


def test_deps_source_names_what_declares_the_manifest_folders_dependencies(tmp_path: Path) -> None:
    manifest = pack(tmp_path, GREET)
    (tmp_path / "pack" / "requirements.txt").write_text("requests\n")
    [answer] = serve([call("AID.PY.GREET.v1", {"name": "Ada"})], "--tools", manifest)
    assert answer["trace"]["deps_source"] == "requirements", answer
    (tmp_path / "pack" / "pyproject.toml").write_text("[project]\nname = 'greetings'\n")
    [answer] = serve([call("AID.PY.GREET.v1", {"name": "Ada"})], "--tools", manifest)
    assert answer["trace"]["deps_source"] == "pyproject", answer


def test_every_front_returns_the_trace(tmp_path: Path) -> None:
    manifest = pack(tmp_path, python_tool("AID.PY.GREET.v1", "tools.sample_tool:greet", python=sys.executable))
    payload = {"name": "Ada"}
    [served, echoed] = serve([call("AID.PY.GREET.v1", payload), call("AID.PY.GREET.v1", payload, trace_id="t-9")],
                             "--tools", manifest)
    check_trace(served["trace"])
    check_trace(echoed["trace"], "t-9")
    ran = run_json("AID.PY.GREET.v1", {"input_json": json.dumps(payload), "trace_id": "t-8"}, "--tools", manifest)
    check_trace(ran["trace"], "t-8")
    for transport in (md.InProcess(tools=[manifest]), md.Pool(tools=[manifest], env=base_env()),
                      md.Spawn(tools=[manifest], env=base_env())):
        with transport:
            r = transport.call("AID.PY.GREET.v1", payload)
            check_trace(r.trace, timeout_ms=30_000)  # the Python transports send their default deadline
            assert r.trace is not None and r.trace["stdout"] == "greeting Ada\n"
    with md.InProcess(tools=[manifest]) as host:
        out = json.loads(host.host.call_json(json.dumps(call("AID.PY.GREET.v1", payload, trace_id="t-7")),
                                             md.Session()))
        check_trace(out["trace"], "t-7")
    bad = serve([call("AID.PY.GREET.v1", payload, trace_id="")], "--tools", manifest)
    assert bad[0]["code"] == "malformed_request" and "trace_id" in bad[0]["error"]
