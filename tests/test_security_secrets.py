"""The lease secret stays out of every tool's reach (a red team read it through
/proc/self/environ and minted leases with it): the host reads it once at start and takes it
out of its environment, including the environment block /proc shows, before any tool can
run; inline tools (C plugins, the file tools) find it nowhere; the key file may not lie in
the tools' workspace. And the ledger that makes leases single-use costs the same per call
however many leases are in use."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import LEASE_SECRET, TOOLHOST, base_env

KEY_SECRET = "key-file-secret-0123456789abcdef"


def secret_seen(found: dict[str, Any], text: str, secret: str) -> bool:
    return (
        found["getenv"] is not None
        or secret in text
        or any(e.startswith("MACHINA_LEASE_SECRET") for e in found["environ"])
    )


@pytest.mark.parametrize("mode", ["serve", "run"])
def test_inline_tools_find_no_secret(test_plugins: dict[str, str], tmp_path: Path, mode: str) -> None:
    env = {
        "MACHINA_LEASE_ENFORCE": "1",
        "MACHINA_LEASE_SECRET": LEASE_SECRET,
        "MACHINA_LEASE_LEDGER": str(tmp_path / "ledger"),
    }
    request = {"aid": "AID.HOSTILE.SECRET.v1", "input_json": json.dumps({"host_pid": 0})}
    args = ["--plugin", test_plugins["hostile_tools"]]
    if mode == "serve":
        proc = subprocess.Popen(
            [TOOLHOST, "--serve", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=base_env(env)
        )
        assert proc.stdin is not None and proc.stdout is not None
        # The host's own /proc/<pid>/environ, by pid: what any process of the user could read.
        request["input_json"] = json.dumps({"host_pid": proc.pid})
        proc.stdin.write(json.dumps(request).encode() + b"\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        proc.stdin.close()
        proc.wait(timeout=10)
    else:
        line = subprocess.run(
            [TOOLHOST, *args, "--run", "AID.HOSTILE.SECRET.v1"],
            input=json.dumps(request).encode(),
            capture_output=True,
            env=base_env(env),
            timeout=30,
        ).stdout
    text = json.loads(line)["output_json"]
    found = json.loads(text)
    assert found["files"]["/proc/self/environ"].count("MACHINA_LEASE_ENFORCE=1") == 1  # it did read the block
    assert not secret_seen(found, text, LEASE_SECRET), text


def test_leases_still_work_once_the_secret_is_out_of_the_environment(tmp_path: Path) -> None:
    env = {
        "MACHINA_LEASE_ENFORCE": "1",
        "MACHINA_LEASE_SECRET": LEASE_SECRET,
        "MACHINA_LEASE_LEDGER": str(tmp_path / "ledger"),
        "MACHINA_TOOLHOST_WORKSPACE": str(tmp_path),
    }
    token = subprocess.run(
        [TOOLHOST, "lease", "issue", "--aid", "AID.FILE.WRITE.v1"],
        capture_output=True,
        text=True,
        env=base_env(env),
        check=True,
    ).stdout.strip()
    req = {"aid": "AID.FILE.WRITE.v1", "input_json": json.dumps({"path": "a", "content": "x"}), "_lease_token": token}
    proc = subprocess.run(
        [TOOLHOST, "--serve"],
        input=(json.dumps(req) + "\n") * 2,
        capture_output=True,
        text=True,
        env=base_env(env),
        timeout=30,
    )
    first, second = (json.loads(x) for x in proc.stdout.splitlines())
    assert first["ok"] is True and second["reason"] == "consumed"


def test_the_file_tools_cannot_read_it_through_proc(tmp_path: Path) -> None:
    # A workspace at / reaches /proc/<pid>/environ without a link: the block itself is wiped.
    script = f"""
import json, os, subprocess, sys
p = subprocess.Popen([{TOOLHOST!r}, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
req = {{"aid": "AID.FILE.READ.v1", "input_json": json.dumps({{"path": f"proc/{{p.pid}}/environ"}})}}
out, _ = p.communicate(json.dumps(req).encode() + b"\\n", timeout=30)
print(out.decode())
"""
    env = base_env({"MACHINA_LEASE_SECRET": LEASE_SECRET, "MACHINA_TOOLHOST_WORKSPACE": "/"})
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    r = json.loads(out.stdout)
    # The read itself works (no link on the way): what it finds has the secret wiped.
    content = json.loads(r["output_json"])["content"]
    assert "\0MACHINA_LEASE_SECRET=\0" in content and LEASE_SECRET not in out.stdout, r


def test_the_in_process_host_wipes_it_from_proc(test_plugins: dict[str, str]) -> None:
    # In a program that embeds the host, the environment is the program's: the variable
    # stays for it and its children (a pool it starts later needs it), but what
    # /proc/<pid>/environ shows any process of the user no longer holds the secret.
    script = f"""
import json, os, subprocess, machina_dispatch as md
t = md.InProcess([{test_plugins["hostile_tools"]!r}])
r = t.call("AID.HOSTILE.SECRET.v1", {{"host_pid": os.getpid()}})
print(r.output_json)
print(md.issue_lease("AID.ECHO.v1", 10) != "")
print(subprocess.run(["sh", "-c", "echo $MACHINA_LEASE_SECRET"], capture_output=True, text=True).stdout.strip())
"""
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env=base_env({"MACHINA_LEASE_SECRET": LEASE_SECRET}),
    )
    assert out.returncode == 0, out.stderr
    text, issued, child = out.stdout.splitlines()
    files = json.loads(text)["files"]
    assert all(LEASE_SECRET not in str(v) for v in files.values()), files
    assert "MACHINA_LEASE_SECRET=\0\0" in files["/proc/self/environ"]  # wiped in place: the block's size is fixed
    assert issued == "True" and child == LEASE_SECRET


def test_a_key_file_inside_the_workspace_is_refused(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "keys").mkdir(parents=True)
    key = ws / "keys" / "lease.key"
    key.write_text(KEY_SECRET + "\n")

    def serve(key_file: Path, stdin: bytes) -> subprocess.CompletedProcess[bytes]:
        env = base_env({"MACHINA_LEASE_ENFORCE": "1", "MACHINA_LEASE_KEY_FILE": str(key_file),
                        "MACHINA_TOOLHOST_WORKSPACE": str(ws), "MACHINA_LEASE_LEDGER": str(tmp_path / "ledger")})
        return subprocess.run([TOOLHOST, "--serve"], input=stdin, capture_output=True, timeout=30, env=env)

    proc = serve(key, b"")
    assert proc.returncode == 2
    assert (
        f"machina-toolhost: the lease key file {key} lies inside the tools' workspace {ws}: move it out "
        "(the file tools would read it)"
    ).encode() in proc.stderr
    outside = tmp_path / "lease.key"
    outside.write_text(KEY_SECRET + "\n")
    proc = serve(outside, b'{"aid":"AID.ECHO.v1"}\n')
    assert proc.returncode == 0 and json.loads(proc.stdout)["ok"] is True


def test_a_leased_call_costs_the_same_however_many_leases_are_in_use(tmp_path: Path) -> None:
    # 12 000 leased calls through one in-process host sharing a ledger: the last 500 cost
    # about what the first 500 did (a ledger that scanned its folder on every call would grow
    # with the leases in use). Compared in one run, never against a time.
    script = f"""
import os, time, json
os.environ.update({{"MACHINA_LEASE_ENFORCE": "1", "MACHINA_LEASE_SECRET": {LEASE_SECRET!r},
                   "MACHINA_LEASE_LEDGER": {str(tmp_path / "ledger")!r}}})
import machina_dispatch as md
from machina_dispatch import _core
t = md.InProcess()
tokens = [_core.issue_lease("AID.FILE.WRITE.v1", 600.0, {LEASE_SECRET!r}) for _ in range(12000)]
times = []
for tok in tokens:
    t0 = time.perf_counter()
    r = t.call("AID.FILE.WRITE.v1", {{"path": "f", "content": ""}}, lease_token=tok, check=False)
    times.append(time.perf_counter() - t0)
    assert r.ok, r
first, last = sorted(times[:500])[250], sorted(times[-500:])[250]
print(json.dumps({{"first": first, "last": last}}))
"""
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env=base_env({"MACHINA_TOOLHOST_WORKSPACE": str(tmp_path)}),
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    medians = json.loads(out.stdout)
    assert medians["last"] < 3 * medians["first"], medians
    assert sum(1 for p in (tmp_path / "ledger").rglob("*") if p.is_file()) == 12000
