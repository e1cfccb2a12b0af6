"""Capability guarantees of Python tools, enforced by the operating system (namespaces,
Landlock, seccomp), not by patching Python functions: each is attacked by a tool in ways
that patching misses (connect_ex, sendto, a raw socket system call through ctypes,
os.posix_spawn, fork through ctypes, exec), and each attack is also run without the
guarantee, so that a test which cannot fail is seen to fail. A guarantee that cannot be
enforced is refused before the tool runs."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import TOOLHOST, base_env, serve
from python_support import call, python_tool, write_pack

ALL = {"no_network": True, "no_subprocess": True, "no_filesystem_write": True, "no_filesystem_read": True,
       "no_env_read": True}
ATTACKS = ["connect_ex", "sendto", "raw_socket_syscall", "posix_spawn", "popen", "ctypes_fork", "exec_other",
           "thread", "write_file", "write_via_fd", "read_file", "environ", "host_environ", "processes"]


def attack_tools(prefix: str, **fields: Any) -> list[dict[str, Any]]:
    return [python_tool(f"AID.{prefix}.{name.upper()}.v1", f"tools.attack:{name}", python=sys.executable, **fields)
            for name in ATTACKS]


@pytest.fixture(scope="module")
def listener() -> Iterator[tuple[int, int]]:
    """A TCP listener and a UDP socket on localhost: (tcp port, udp port)."""
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(16)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    yield tcp.getsockname()[1], udp.getsockname()[1]
    tcp.close()
    udp.close()


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("guarantees")
    secret = base / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("the secret")
    writable = base / "writable"
    writable.mkdir()
    readable = base / "readable"
    readable.mkdir()
    (readable / "data.txt").write_text("declared data")
    guarded = write_pack(base / "guarded", attack_tools("G", guarantees=ALL, filesystem_root=str(writable),
                                                        filesystem_read_roots=[str(readable)]))
    sandboxed = write_pack(base / "sandboxed", attack_tools("S", sandbox=True))
    plain = write_pack(base / "plain", attack_tools("P"))
    return {"base": base, "secret": secret, "writable": writable, "readable": readable, "guarded": guarded,
            "sandboxed": sandboxed, "plain": plain}


def run_attacks(prefix: str, manifest: Path, places: dict[str, Path], ports: tuple[int, int],
                target: str) -> dict[str, dict[str, Any]]:
    """Every attack once, through one host; name -> response. The host has a secret in its
    environment (passed on to its workers unless no_env_read)."""
    tcp, udp = ports
    host = subprocess.Popen([TOOLHOST, "--serve", "--tools", str(manifest), "--worker-env", "MACHINA_TEST_SECRET"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env=base_env({"MACHINA_TEST_SECRET": "s3cret"}))
    payloads: dict[str, dict[str, Any]] = {
        "connect_ex": {"port": tcp}, "sendto": {"port": udp}, "write_file": {"path": target},
        "write_via_fd": {"path": target + ".fd"}, "read_file": {"path": str(places["secret"])},
        "host_environ": {"pid": host.pid},
    }
    requests = [call(f"AID.{prefix}.{name.upper()}.v1", payloads.get(name, {}), id=i) for i, name in enumerate(ATTACKS)]
    out, _ = host.communicate(b"".join(json.dumps(r).encode() + b"\n" for r in requests), timeout=120)
    assert host.returncode == 0
    responses = [json.loads(line) for line in out.splitlines()]
    return {ATTACKS[r["id"]]: r for r in responses}


def refused(r: dict[str, Any], *words: str) -> bool:
    """The attack failed inside the tool (the call itself ran and answered)."""
    text = r.get("error", "") + r.get("output_json", "")
    return r["status"] in ("TOOL_ERROR", "OK") and any(w in text for w in words)


@pytest.fixture(scope="module")
def unguarded(places: dict[str, Path], listener: tuple[int, int]) -> dict[str, dict[str, Any]]:
    return run_attacks("P", places["plain"], places, listener, str(places["base"] / "plain-wrote.txt"))


@pytest.fixture(scope="module")
def guarded(places: dict[str, Path], listener: tuple[int, int]) -> dict[str, dict[str, Any]]:
    return run_attacks("G", places["guarded"], places, listener, str(places["base"] / "guarded-wrote.txt"))


@pytest.fixture(scope="module")
def sandboxed(places: dict[str, Path], listener: tuple[int, int]) -> dict[str, dict[str, Any]]:
    return run_attacks("S", places["sandboxed"], places, listener, str(places["base"] / "sandboxed-wrote.txt"))


def output(r: dict[str, Any]) -> Any:
    assert r["ok"], r
    return json.loads(r["output_json"])


def test_without_guarantees_every_attack_works(unguarded: dict[str, dict[str, Any]], places: dict[str, Path]) -> None:
    """The control: the same tools, unguarded, get through (the attacks are real)."""
    assert output(unguarded["connect_ex"]) == {"connect_ex": 0}
    assert output(unguarded["sendto"]) == {"sent": 4}
    assert output(unguarded["raw_socket_syscall"])["fd"] >= 0
    assert output(unguarded["posix_spawn"]) == {"spawned": 0}
    assert output(unguarded["popen"]) == {"stdout": "escaped\n"}
    assert output(unguarded["ctypes_fork"])["fork"] > 0
    assert output(unguarded["read_file"]) == "the secret"
    assert (places["base"] / "plain-wrote.txt").read_text() == "written"
    assert output(unguarded["environ"])["MACHINA_TEST_SECRET"] == "s3cret"
    assert "MACHINA_TEST_SECRET" in output(unguarded["host_environ"])  # the host's environment, via /proc
    assert unguarded["exec_other"]["code"] == "tool_crashed"  # the worker was replaced by echo


def test_no_network(guarded: dict[str, dict[str, Any]], sandboxed: dict[str, dict[str, Any]]) -> None:
    for results in (guarded, sandboxed):
        assert refused(results["connect_ex"], "PermissionError", "Errno 13"), results["connect_ex"]
        assert refused(results["sendto"], "PermissionError"), results["sendto"]
        assert output(results["raw_socket_syscall"]) == {"fd": -1, "errno": 13}  # EACCES from seccomp


def test_no_subprocess(guarded: dict[str, dict[str, Any]], sandboxed: dict[str, dict[str, Any]]) -> None:
    for results in (guarded, sandboxed):
        assert refused(results["posix_spawn"], "Operation not permitted"), results["posix_spawn"]
        assert refused(results["popen"], "Operation not permitted"), results["popen"]
        assert output(results["ctypes_fork"]) == {"fork": -1, "errno": 1}  # EPERM from seccomp
        assert refused(results["exec_other"], "Permission denied"), results["exec_other"]  # Landlock
        assert output(results["thread"]) == ["ran in a thread"]  # threads still work


def test_no_filesystem_write(guarded: dict[str, dict[str, Any]], sandboxed: dict[str, dict[str, Any]],
                             places: dict[str, Path], listener: tuple[int, int]) -> None:
    for results in (guarded, sandboxed):
        # (refused by Landlock, or first by the read-only mount outside the writable folders)
        assert refused(results["write_file"], "Permission denied", "Read-only file system"), results["write_file"]
        assert refused(results["write_via_fd"], "Permission denied", "Read-only file system"), results["write_via_fd"]
    for name in ("guarded", "sandboxed"):
        assert not (places["base"] / f"{name}-wrote.txt").exists()
        assert not (places["base"] / f"{name}-wrote.txt.fd").exists()
    # Beneath the declared filesystem_root, writing works.
    inside = run_attacks("G", places["guarded"], places, listener, str(places["writable"] / "ok.txt"))
    assert inside["write_file"]["ok"] and (places["writable"] / "ok.txt").read_text() == "written"


def test_no_filesystem_read(guarded: dict[str, dict[str, Any]], places: dict[str, Path]) -> None:
    assert refused(guarded["read_file"], "Permission denied"), guarded["read_file"]
    r = serve([call("AID.G.READ_FILE.v1", {"path": str(places["readable"] / "data.txt")}),
               call("AID.G.READ_FILE.v1", {"path": "/etc/hostname"}),
               call("AID.G.READ_FILE.v1", {"path": str(Path(__file__))})], "--tools", str(places["guarded"]))
    assert output(r[0]) == "declared data"  # filesystem_read_roots
    assert "Permission denied" in r[1]["error"] and "Permission denied" in r[2]["error"]


def test_no_env_read(guarded: dict[str, dict[str, Any]], sandboxed: dict[str, dict[str, Any]]) -> None:
    env = output(guarded["environ"])
    assert "MACHINA_TEST_SECRET" not in env and "PATH" not in env and "HOME" not in env
    assert set(env) <= {"LC_CTYPE"}  # (the interpreter sets its own locale coercion)
    # The host's environment is not reachable through /proc: no other process is there.
    for results in (guarded, sandboxed):
        assert refused(results["host_environ"], "No such file", "Permission denied"), results["host_environ"]
    assert output(sandboxed["processes"]) == [1, 2]  # the sandbox's init and the worker


def test_each_response_says_what_enforced_each_guarantee(guarded: dict[str, dict[str, Any]],
                                                         sandboxed: dict[str, dict[str, Any]],
                                                         unguarded: dict[str, dict[str, Any]]) -> None:
    trace = guarded["thread"]["trace"]
    assert trace["enforcement_level"] == "enforced"
    how = trace["enforcement"]
    assert set(how) == set(ALL)
    assert "network namespace" in how["no_network"] and "seccomp" in how["no_network"]
    assert "seccomp" in how["no_subprocess"] and "Landlock" in how["no_subprocess"]
    assert "Landlock" in how["no_filesystem_write"] and "Landlock" in how["no_filesystem_read"]
    assert "empty environment" in how["no_env_read"]
    assert set(sandboxed["thread"]["trace"]["enforcement"]) == {"sandbox", "no_network", "no_subprocess",
                                                                 "no_filesystem_write"}
    assert sandboxed["thread"]["trace"]["sandbox"] is True
    assert unguarded["thread"]["trace"]["enforcement_level"] == "none"


def test_a_guarantee_that_cannot_be_enforced_is_refused_before_the_tool_runs(tmp_path: Path) -> None:
    mark = tmp_path / "ran.txt"
    manifest = write_pack(tmp_path / "pack", [
        python_tool("AID.PY.ENVW.v1", "tools.sample_tool:counter", guarantees={"no_env_write": True}),
        python_tool("AID.PY.READ.v1", "tools.sample_tool:counter", guarantees={"no_filesystem_read": True}),
        python_tool("AID.PY.NET.v1", "tools.sample_tool:counter", guarantees={"no_network": True}),
    ])
    r = serve([call("AID.PY.ENVW.v1", {"file": str(mark)})], "--tools", str(manifest))
    assert (r[0]["status"], r[0]["code"]) == ("TOOL_ERROR", "guarantee_blocked")
    assert "no_env_write cannot be enforced" in r[0]["error"]
    assert r[0]["trace"]["reason_code"] == "guarantee_blocked"
    assert r[0]["trace"]["enforcement_level"] == "not_enforceable"
    # Landlock turned off by the operator: reads cannot be confined, so such calls are refused;
    # a guarantee that does not need it is still enforced.
    r = serve([call("AID.PY.READ.v1", {"file": str(mark)}), call("AID.PY.NET.v1", {"file": str(mark)})],
              "--tools", str(manifest), env={"MACHINA_TOOLHOST_NO_LANDLOCK": "1"})
    assert r[0]["code"] == "guarantee_blocked" and "needs Landlock" in r[0]["error"]
    assert r[1]["ok"]
    assert mark.read_text() == "1"  # only the last call ran its tool
