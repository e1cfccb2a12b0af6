"""The spawn transport and the dispatch function run_machina_toolhost(): input normalisation, the
timeout (argument, MACHINA_TOOLHOST_TIMEOUT, 30 s default), the process group killed on
timeout, the 1 MB stdout cap, stderr drained with a bounded tail, and the dispatch error
types (timeout, crash, parse_error, empty_output, tool_error, not_found, exception) as dicts."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import machina_dispatch as md
import pytest
from conftest import HANG_GUARD_S, LIST_HINT, PAST_GUARD_S, TOOLHOST, scaled
from dispatch_support import orphans_since, patched_environ, toolhost_processes


@pytest.fixture
def plugins(misbehaving: str) -> list[str]:
    return [misbehaving, str(md.builtin_plugin_path())]


def run(aid: str, inputs: Any = None, **kw: Any) -> Any:
    kw.setdefault("executable", TOOLHOST)
    return md.run_machina_toolhost(aid, inputs, **kw)


def failure(aid: str, inputs: Any = None, **kw: Any) -> dict[str, Any]:
    """run_machina_toolhost's answer to a call that fails: a dict (an output would be a str)."""
    out = md.run_machina_toolhost(aid, inputs, **kw)
    assert isinstance(out, dict), out
    return out


@pytest.mark.parametrize(("inputs", "input_json"), [
    ({"q": "x", "k": 3}, '{"q":"x","k":3}'),
    ([1, "é"], '[1,"é"]'),
    ('{"already": "json"}', '{"already": "json"}'),
    (None, "{}"),
    (7, "7"),
    (b'{"b": 1}', '{"b": 1}'),
])
def test_inputs_are_normalised(inputs: Any, input_json: str) -> None:
    # As the dispatch contract says: the output string on success.
    assert run("AID.ECHO.v1", inputs) == input_json


def test_not_json_encodable_inputs_are_an_exception() -> None:
    out = run("AID.ECHO.v1", {1, 2})
    assert out["error"] is True and out["type"] == "exception" and out["aid"] == "AID.ECHO.v1"
    assert "not JSON serializable" in out["detail"]
    out = run("AID.ECHO.v1", float("nan"))
    assert out["type"] == "exception" and "not JSON-encodable" in out["detail"]


def test_host_errors_are_tool_errors_that_keep_their_code() -> None:
    # As the dispatch function it stands in for: any answer whose status is not OK.
    assert run("AID.NOPE.v1") == {"error": True, "aid": "AID.NOPE.v1", "type": "tool_error",
                                  "detail": "tool not found: AID.NOPE.v1", "code": "tool_not_found",
                                  "status": "INVALID_PICK", "hint": LIST_HINT}
    bad = run("AID.TEXT.STATS.v1", {"text": 1})
    assert (bad["type"], bad["code"], bad["status"]) == ("tool_error", "schema_violation", "INVALID_PICK")


def test_not_found(tmp_path: Path) -> None:
    out = run("AID.ECHO.v1", executable=tmp_path / "no-such-host")
    assert out["type"] == "not_found" and out["error"] is True
    with patched_environ({"MACHINA_TOOLHOST_BIN": str(tmp_path / "missing")}):
        assert failure("AID.ECHO.v1")["type"] == "not_found"
    with pytest.raises(md.ExecutableNotFound) as caught:
        md.Spawn(tmp_path / "missing").call("AID.ECHO.v1")
    assert isinstance(caught.value, FileNotFoundError)


def test_timeout_from_argument_and_environment(plugins: list[str]) -> None:
    before = toolhost_processes()
    started = time.monotonic()
    out = run("AID.TEST.SLEEPER.v1", timeout=0.3, plugins=plugins)
    assert 0.3 <= time.monotonic() - started < scaled(HANG_GUARD_S)
    assert out["type"] == "tool_error" and out["code"] == "timeout"  # the host answered on time
    assert out["detail"] == "timeout: AID.TEST.SLEEPER.v1 did not finish within 300 ms"
    with patched_environ({"MACHINA_TOOLHOST_TIMEOUT": "0.25"}):
        out = failure("AID.TEST.HANG.v1", executable=TOOLHOST, plugins=plugins)
    assert out["detail"] == "timeout: AID.TEST.HANG.v1 did not finish within 250 ms"
    assert not orphans_since(before)


def test_the_tools_children_are_killed_with_the_group(plugins: list[str], tmp_path: Path) -> None:
    """SLEEPER starts `sleep N` in the host's process group and hangs: after the call,
    nothing of it is left. N is this test's own, so other processes on the machine (a
    concurrent test run) cannot be mistaken for it."""
    seconds = random.randrange(100_000, 10_000_000)
    run("AID.TEST.SLEEPER.v1", {"seconds": seconds}, timeout=0.3, plugins=plugins)
    time.sleep(0.2)
    mine = [p for p in os.listdir("/proc") if p.isdigit() and _cmdline(p) == f"sleep {seconds}"]
    assert not mine, f"tool children left behind: {mine}"


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def test_default_timeout_is_30_seconds() -> None:
    with patched_environ({}):
        assert md.Spawn(TOOLHOST).timeout == 30.0
    with patched_environ({"MACHINA_TOOLHOST_TIMEOUT": "2.5"}):
        assert md.Spawn(TOOLHOST).timeout == 2.5
    with patched_environ({"MACHINA_TOOLHOST_TIMEOUT": "soon"}), pytest.raises(ValueError):
        md.Spawn(TOOLHOST)


def test_crash_reports_exit_and_stderr_tail(plugins: list[str]) -> None:
    out = run("AID.TEST.NOISYCRASH.v1", {"bytes": 200_000}, plugins=plugins)
    assert out["type"] == "crash" and out["exit_status"] == -11
    assert out["detail"].startswith("machina-toolhost was killed by signal 11 (SIGSEGV: Segmentation fault); stderr: ")
    assert out["stderr"].endswith("LAST WORDS\n") and len(out["stderr"].encode()) <= 4096
    out = run("AID.ECHO.v1", plugins=[str(Path(plugins[0]).parent / "missing.so")])
    assert out["type"] == "crash" and out["exit_status"] == 2 and "missing.so" in out["detail"]


def test_stdout_cap_stops_reading(plugins: list[str]) -> None:
    t = md.Spawn(TOOLHOST, plugins=plugins, max_output_bytes=64 * 1024)
    r = t.call("AID.TEST.HUGE.v1", {"bytes": 500_000}, check=False)
    assert r.kind == "parse_error" and "exceeded the 65536-byte cap" in r.error
    # Under the cap all is well; the dispatch client's cap is 1 MiB.
    assert md.Spawn(TOOLHOST, plugins=plugins).call("AID.TEST.HUGE.v1", {"bytes": 500_000}).ok
    assert md.spawn.MAX_OUTPUT_BYTES == 1024 * 1024


def _fake_host(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake-host"
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return str(path)


def test_stdout_cap_stops_reading_a_host_that_writes_on(tmp_path: Path) -> None:
    # 64 MiB at a reader that stops at 1 MiB: the writer can never finish (a pipe holds
    # 64 KiB), so its marker file is never written; a reader that took it all would let it.
    marker = tmp_path / "wrote-everything"
    host = _fake_host(tmp_path, f"""
        import sys
        sys.stdout.buffer.write(b"a" * (64 << 20))
        sys.stdout.buffer.flush()
        open({str(marker)!r}, "w").close()
    """)
    started = time.monotonic()
    out = failure("AID.ECHO.v1", executable=host, timeout=PAST_GUARD_S)
    assert out["type"] == "parse_error" and "exceeded the 1048576-byte cap" in out["detail"]
    assert time.monotonic() - started < scaled(HANG_GUARD_S)  # not its timeout
    time.sleep(0.2)
    assert not marker.exists()


def test_a_host_that_never_answers_is_killed_with_its_group(tmp_path: Path) -> None:
    # The host itself hangs (it ignores its deadline) and has a child in its process
    # group: the client's own timeout ends both.
    seconds = random.randrange(100_000, 10_000_000)
    pid_file = tmp_path / "host-pid"
    host = _fake_host(tmp_path, f"""
        import os, subprocess, time
        open({str(pid_file)!r}, "w").write(str(os.getpid()))
        subprocess.Popen(["sleep", "{seconds}"])
        time.sleep(3600)
    """)
    started = time.monotonic()
    out = failure("AID.ECHO.v1", executable=host, timeout=1.0)
    assert out["type"] == "timeout"
    assert 1.0 <= time.monotonic() - started < scaled(HANG_GUARD_S)
    time.sleep(0.2)
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _cmdline(p) == f"sleep {seconds}"]
    assert not Path(f"/proc/{pid_file.read_text()}").exists()


@pytest.mark.parametrize(("body", "why"), [
    ("print('not json')", "stdout is not a response"),
    ("print('{\"ok\": true}'); print('{\"ok\": true}')", "got 2 lines"),
    ("print(1)", "stdout is not a response"),
])
def test_parse_errors(tmp_path: Path, body: str, why: str) -> None:
    fake = _fake_host(tmp_path, "import sys; sys.stdin.read()\n" + body)
    out = failure("AID.ECHO.v1", executable=fake)
    assert out["type"] == "parse_error" and why in out["detail"], out


def test_no_output_and_a_short_failure_line(tmp_path: Path) -> None:
    out = failure("AID.ECHO.v1", executable=_fake_host(tmp_path, "import sys; sys.stdin.read()\n"))
    assert out["type"] == "empty_output" and "wrote nothing on stdout" in out["detail"], out
    # A failure in the shortest form (no status) keeps its text.
    short_line = "print('{\"ok\": false, \"error\": \"tool not found: X\"}')"
    fake = _fake_host(tmp_path, "import sys; sys.stdin.read()\n" + short_line)
    out = failure("AID.ECHO.v1", executable=fake)
    assert (out["type"], out["detail"]) == ("tool_error", "tool not found: X"), out
    # A lease refusal in that form keeps its fields.
    lease_line = "print('{\"ok\": false, \"error\": \"lease_required\", \"tier\": 2, \"aid\": \"AID.X.v1\"}')"
    out = failure("AID.X.v1", executable=_fake_host(tmp_path, "import sys; sys.stdin.read()\n" + lease_line))
    assert (out["type"], out["detail"], out["tier"], out["aid"]) == ("tool_error", "lease_required", 2, "AID.X.v1"), out


@pytest.mark.parametrize("status", ["TOOL_ERROR", "INVALID_PICK", "BREAKER_TRIP"])
def test_a_failure_with_a_status_and_no_code_is_a_tool_error(tmp_path: Path, status: str) -> None:
    """The dispatch contract's response (status, output_json, error; no `code`) with a status
    other than OK is a `tool_error` keeping its text and status, as its dispatch layer reads it."""
    line = f"print('{{\"ok\": false, \"status\": \"{status}\", \"output_json\": \"\", \"error\": \"boom\"}}')"
    out = failure("AID.ECHO.v1", executable=_fake_host(tmp_path, "import sys; sys.stdin.read()\n" + line))
    assert (out["type"], out["detail"], out["status"]) == ("tool_error", "boom", status), out
    assert "code" not in out


def test_stderr_is_drained_while_running(tmp_path: Path) -> None:
    """A host writing megabytes to stderr before answering does not dead-lock on a full
    pipe, and only the tail is kept."""
    fake = _fake_host(tmp_path, """
        import sys
        sys.stdin.read()
        for _ in range(200):
            sys.stderr.write("e" * 10000 + "\\n")
        sys.stderr.flush()
        print('{"ok":true,"status":"OK","output_json":"1","error":"","ds_state":{"slots":{}}}')
        sys.exit(3)
    """)
    out = failure("AID.ECHO.v1", executable=fake, timeout=20)
    assert out["type"] == "crash" and out["exit_status"] == 3 and len(out["stderr"]) <= 4096


def test_the_host_starts_clean(tmp_path: Path) -> None:
    """The host process gets its own process group, SIGPIPE and SIGXFSZ at their defaults
    (Python ignores both), no blocked signals, and this process's environment or `env`."""
    fake = tmp_path / "fake-host"
    fake.write_text(textwrap.dedent(r"""
        #!/bin/sh
        cat > /dev/null
        status=$(cat /proc/$$/status)
        ign=$(echo "$status" | sed -n 's/^SigIgn:[[:space:]]*//p')
        blk=$(echo "$status" | sed -n 's/^SigBlk:[[:space:]]*//p')
        pgid=$(cut -d' ' -f5 /proc/$$/stat)
        out='[\\"%s\\",\\"%s\\",%s,%s,\\"%s\\"]'
        printf '{"ok":true,"status":"OK","output_json":"'"$out"'","error":"","ds_state":{"slots":{}}}\n' \
          "$ign" "$blk" "$pgid" "$$" "$MACHINA_SPAWN_PROBE"
        """).lstrip())
    fake.chmod(0o755)
    with patched_environ({"MACHINA_SPAWN_PROBE": "inherited"}):
        out = md.run_machina_toolhost("AID.ECHO.v1", executable=fake)
        given = md.Spawn(fake, env={"MACHINA_SPAWN_PROBE": "given"}).call("AID.ECHO.v1")
    assert isinstance(out, str), out
    ign, blk, pgid, pid, probe = json.loads(out)
    assert int(ign, 16) & (1 << (13 - 1) | 1 << (25 - 1)) == 0  # SIGPIPE, SIGXFSZ
    assert int(blk, 16) == 0
    assert pgid == pid
    assert probe == "inherited"
    assert json.loads(given.output_json)[4] == "given"


def test_works_with_standard_streams_closed(tmp_path: Path) -> None:
    """A caller without standard streams (a daemon) still gets answers: the pipes then
    take descriptors 0-2, which the host must not confuse with its own."""
    result = tmp_path / "result.json"
    script = textwrap.dedent(f"""
        import json, os
        for fd in (0, 1, 2):
            os.close(fd)
        import machina_dispatch as md
        out = md.run_machina_toolhost("AID.ECHO.v1", {{"a": 1}}, executable={TOOLHOST!r})
        open({str(result)!r}, "w").write(json.dumps(out))
    """)
    proc = subprocess.run([sys.executable, "-c", script], timeout=60)
    assert proc.returncode == 0
    assert json.loads(result.read_text()) == '{"a":1}'


def test_state_round_trip(plugins: list[str]) -> None:
    state = md.DsState()
    out = run("AID.STATE.PUT.v1", {"slot": 4, "type": "t", "content": {"v": 1}}, ds_state=state, plugins=plugins)
    assert json.loads(out) == {"size_bytes": 7, "slot": "DS4"} and state["DS4"].content == {"v": 1}
    out = run("AID.STATE.GET.v1", {"slot": 4}, ds_state=state, plugins=plugins)
    assert json.loads(out)["content"] == {"v": 1}
    # A wire dict works too, in either naming of the slots (the dispatch contract's "0".."7").
    for name in ("DS0", "0"):
        out = run("AID.STATE.GET.v1", {"slot": 0}, plugins=plugins,
                  ds_state={"slots": {name: {"type": "t", "content_json": "[1]"}}})
        assert json.loads(out)["content"] == [1]


def test_any_transport_through_the_dispatch_function(plugins: list[str]) -> None:
    with md.Pool(1, executable=TOOLHOST, plugins=plugins) as pool:
        assert md.run_machina_toolhost("AID.ECHO.v1", [5], transport=pool) == "[5]"
        assert failure("AID.NOPE.v1", transport=pool)["type"] == "tool_error"


def test_spawn_cost_is_one_process(plugins: list[str]) -> None:
    """Each call is one process that is gone afterwards."""
    before = toolhost_processes()
    t = md.Spawn(TOOLHOST)
    for i in range(20):
        assert t.call("AID.ECHO.v1", i).output == i
    assert not orphans_since(before, wait_s=0.5)
    assert re.match(r"^\d+\.\d+", md.__version__)
