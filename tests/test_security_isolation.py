"""Hostile isolated tools (--isolation process): a plugin written against the public ABI
header alone (tests/plugins/hostile_tools.c) tries every way out of its call that a red
team found or that follows from them, and none may work: forging lines on the host's wire
through /proc, signalling or tracing the host, leaving a process, a session escapee or a
thread behind to read or answer the next call, answering early and running on, reading the
lease secret, starting threads or processes while the plugin loads."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import process_tree
import pytest
from conftest import LEASE_SECRET, TOOLHOST, base_env

ISOLATED = ("--isolation", "process")


class Host:
    """One `--serve --isolation process` host with the hostile plugin and the built-ins,
    spoken to one line at a time."""

    def __init__(self, plugins: dict[str, str], *args: str, env: dict[str, str] | None = None,
                 plugin: str = "hostile_tools") -> None:
        import machina_dispatch

        self.proc = subprocess.Popen(
            [TOOLHOST, "--serve", *ISOLATED, "--plugin", plugins[plugin],
             "--plugin", str(machina_dispatch.builtin_plugin_path()), *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=base_env(env))

    def call(self, aid: str, rid: Any, **inputs: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        line = json.dumps({"id": rid, "aid": aid, "input_json": json.dumps(inputs)}) + "\n"
        self.proc.stdin.write(line.encode())
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        assert answer, f"no answer to {rid}: the host is gone ({self.proc.poll()})"
        r: dict[str, Any] = json.loads(answer)
        assert r["id"] == rid, r  # a forged line would come first
        return r

    def close(self) -> tuple[bytes, bytes]:
        out, err = self.proc.communicate(timeout=30)
        assert self.proc.returncode == 0, err
        return out, err


@pytest.fixture
def host(test_plugins: dict[str, str]) -> Any:
    h = Host(test_plugins)
    yield h
    if h.proc.poll() is None:
        h.proc.kill()
        h.proc.wait()


def echo_still_answers(h: Host, rid: str) -> None:
    r = h.call("AID.ECHO.v1", rid, who=rid)
    assert r["ok"] is True and json.loads(r["output_json"]) == {"who": rid}, r


def marker_goes_stale(marker: Path, within_s: float = 2.0) -> bool:
    """True once the marker file a hostile process keeps fresh stops changing."""
    deadline = time.monotonic() + within_s
    last = marker.read_text() if marker.exists() else ""
    while time.monotonic() < deadline:
        time.sleep(0.15)
        now = marker.read_text() if marker.exists() else ""
        if now == last:
            return True
        last = now
    return False


def test_a_tool_cannot_write_to_the_hosts_wire(host: Host) -> None:
    r = host.call("AID.HOSTILE.WIRE.v1", "w", host_pid=host.proc.pid)
    out = json.loads(r["output_json"])
    assert out["tried"] > 64 and out["opened"] == 0, out
    echo_still_answers(host, "after")
    rest, _ = host.close()
    assert b"forged" not in rest


def test_a_tool_cannot_signal_or_trace_the_host(host: Host) -> None:
    r = host.call("AID.HOSTILE.SIGNAL.v1", "s", host_pid=host.proc.pid)
    out = json.loads(r["output_json"])
    # The host is not in the call's PID namespace: it has no pid there, no parent pid.
    assert out["ppid"] == 0 and out["kill_host"] != 0 and out["kill_host_group"] != 0, out
    echo_still_answers(host, "after-signal")  # 2 of 2 answers
    r = host.call("AID.HOSTILE.TRACE.v1", "t", host_pid=host.proc.pid)
    out = json.loads(r["output_json"])
    assert out["attach"] != 0 and out["vm_read"] != 0 and out["mem"] != 0, out
    echo_still_answers(host, "after-trace")


@pytest.mark.parametrize("aid", ["AID.HOSTILE.LINGER.v1", "AID.HOSTILE.THREAD.v1"])
def test_nothing_a_call_starts_outlives_it(test_plugins: dict[str, str], tmp_path: Path, aid: str) -> None:
    # A double-forked escapee in a session of its own (it also reads and writes every
    # descriptor it inherited, hoping for the next call), or a thread: gone with the call.
    h = Host(test_plugins)
    marker = tmp_path / "alive"
    r = h.call(aid, "c1", marker=str(marker))
    assert r["ok"] is True, r
    before = set(process_tree.descendants(h.proc.pid))
    for i in range(3):
        echo_still_answers(h, f"next-{i}")
    assert marker_goes_stale(marker), "a process or thread of the call lives on"
    # Only the worker (launcher, template) and the call processes it keeps ready remain.
    left = [p for p in process_tree.descendants(h.proc.pid) if p in before]
    assert len(left) <= 4, [process_tree.cmdline(p) for p in left]
    out, _ = h.close()
    assert b"stolen" not in out


def test_a_tool_that_answers_early_cannot_answer_the_next_call(test_plugins: dict[str, str],
                                                               tmp_path: Path) -> None:
    h = Host(test_plugins)
    marker = tmp_path / "alive"
    r = h.call("AID.HOSTILE.EARLY.v1", "early", marker=str(marker))
    # Its early frame answers its own call (that much is its to say)...
    assert r["ok"] is True and json.loads(r["output_json"]) == {"early": True}, r
    # ... but the process is killed with that answer: it cannot read or answer the next.
    for i in range(5):
        echo_still_answers(h, f"next-{i}")
    assert marker_goes_stale(marker, within_s=1.0)
    out, _ = h.close()
    assert b"stolen" not in out


def test_a_tool_cannot_find_the_lease_secret(test_plugins: dict[str, str], tmp_path: Path) -> None:
    key = tmp_path / "lease.key"
    key.write_text("key-file-secret-0123456789abcdef\n")
    key.chmod(0o600)
    ledger = str(tmp_path / "ledger")
    # The secret given in the environment: in none of the tool's environment, its /proc
    # (its own, its sandbox's init's, the host's by pid), nowhere.
    h = Host(test_plugins, env={"MACHINA_LEASE_ENFORCE": "1", "MACHINA_LEASE_SECRET": LEASE_SECRET,
                                "MACHINA_LEASE_LEDGER": ledger})
    text = h.call("AID.HOSTILE.SECRET.v1", "env", host_pid=h.proc.pid)["output_json"]
    found = json.loads(text)
    assert found["getenv"] is None and LEASE_SECRET not in text, text
    assert not any(e.startswith("MACHINA_LEASE") for e in found["environ"]), found["environ"]
    h.close()
    # The secret in a key file: its path is there to open, but what it holds is not.
    h = Host(test_plugins, env={"MACHINA_LEASE_ENFORCE": "1", "MACHINA_LEASE_KEY_FILE": str(key),
                                "MACHINA_LEASE_LEDGER": ledger})
    text = h.call("AID.HOSTILE.SECRET.v1", "file", host_pid=h.proc.pid, key_file=str(key))["output_json"]
    found = json.loads(text)
    assert "key-file-secret" not in text, text
    assert found["files"][str(key)] == "", found["files"]
    assert not any(e.startswith("MACHINA_LEASE") for e in found["environ"]), found["environ"]
    h.close()


def test_the_worker_environment_is_explicit(test_plugins: dict[str, str]) -> None:
    h = Host(test_plugins, "--worker-env", "EXTRA_FOR_TOOLS",
             env={"EXTRA_FOR_TOOLS": "yes", "NOT_FOR_TOOLS": "no", "PATH": "/usr/bin:/bin"})
    found = json.loads(h.call("AID.HOSTILE.SECRET.v1", "env", host_pid=0)["output_json"])
    names = sorted(e.split("=", 1)[0] for e in found["environ"])
    assert "EXTRA_FOR_TOOLS" in names and "NOT_FOR_TOOLS" not in names and "PATH" in names, names
    h.close()
    proc = subprocess.run([TOOLHOST, "--serve", *ISOLATED, "--worker-env", "MACHINA_LEASE_SECRET"],
                          input=b'{"aid":"AID.ECHO.v1"}\n', capture_output=True, env=base_env(), timeout=30)
    assert b"the lease variables are never passed to workers: MACHINA_LEASE_SECRET" in proc.stdout + proc.stderr


@pytest.mark.parametrize(("plugin", "why"), [
    ("hostile_thread_at_load", "started 1 thread(s) while loading; isolated plugins must not"),
    ("hostile_fork_at_load", "started a process while loading; isolated plugins must not"),
])
def test_a_plugin_that_leaves_code_running_while_loading_is_refused(test_plugins: dict[str, str], plugin: str,
                                                                     why: str) -> None:
    # The host never loads an isolated plugin itself (its load-time code would run in the
    # host): a sandboxed worker loads it and describes its tools. What such code leaves
    # running there would outlive every call, so the plugin is refused up front.
    before = set(process_tree.descendants())
    proc = subprocess.run([TOOLHOST, "--serve", *ISOLATED, "--plugin", test_plugins[plugin]],
                          input=b'{"aid":"AID.ECHO.v1"}\n', capture_output=True, env=base_env(), timeout=30)
    assert proc.returncode == 2 and proc.stdout == b"", proc
    assert f"machina-toolhost: plugin {test_plugins[plugin]}: a plugin {why}".encode() in proc.stderr, proc.stderr
    assert not set(process_tree.descendants()) - before, "the refused worker left processes behind"


def test_an_isolated_plugin_is_never_loaded_into_the_host(test_plugins: dict[str, str]) -> None:
    # Listing the tools of an isolated plugin runs none of its code in the host: the
    # fork-at-load variant would leave a process of the host behind if it did.
    proc = subprocess.run([TOOLHOST, "--list", *ISOLATED, "--plugin", test_plugins["hostile_tools"]],
                          capture_output=True, env=base_env(), timeout=30)
    assert proc.returncode == 0, proc.stderr
    tools = json.loads(proc.stdout)["tools"]
    assert {t["aid"] for t in tools} >= {"AID.HOSTILE.WIRE.v1", "AID.HOSTILE.EARLY.v1"}
    assert all(t["plugin"] == test_plugins["hostile_tools"] and t["runner"] == "process" for t in tools)
    maps = subprocess.run([TOOLHOST, "--serve", *ISOLATED, "--plugin", test_plugins["hostile_tools"]],
                          input=b'{"aid":"AID.HOSTILE.SIGNAL.v1","input_json":"{}"}\n', capture_output=True,
                          env=base_env(), timeout=30)
    assert json.loads(maps.stdout)["ok"] is True
