"""The audit store on by default: every call of the executable's fronts is recorded in a
per-user state folder ($XDG_STATE_HOME/machina-toolhost/audit.db), with `duration_ms` and the
caller's user as the front knows it; `--no-audit` (or MACHINA_TOOLHOST_AUDIT=0) turns it off,
and a state folder that cannot hold it does not stop the host."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import re
import sqlite3
import stat
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

from conftest import TOOLHOST, base_env
from test_audit import call_log

ECHO = {"aid": "AID.ECHO.v1", "input_json": json.dumps({"msg": "hi"})}
OS_USER = pwd.getpwuid(os.geteuid()).pw_name


def env_for(state: Path, **extra: str) -> dict[str, str]:
    return base_env({"XDG_STATE_HOME": str(state), **extra})


def run_once(state: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TOOLHOST, *args, "--run", "AID.ECHO.v1"], input=json.dumps(ECHO), capture_output=True,
                          text=True, env=env_for(state, **extra), timeout=30)


def serve_once(state: Path, *args: str, lines: int = 1, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TOOLHOST, "--serve", *args], input=(json.dumps(ECHO) + "\n") * lines,
                          capture_output=True, text=True, env=env_for(state, **extra), timeout=30)


def test_run_and_serve_are_recorded_by_default(tmp_path: Path) -> None:
    state = tmp_path / "state"
    ran = run_once(state)
    assert ran.returncode == 0 and json.loads(ran.stdout)["ok"], ran.stderr
    served = serve_once(state, lines=2)
    assert served.returncode == 0 and served.stderr == "", served.stderr
    folder = state / "machina-toolhost"
    db = folder / "audit.db"
    got = call_log(db)
    assert [(r["tool"], r["front"], r["user"], r["code"]) for r in got] == [
        ("AID.ECHO.v1", "run", OS_USER, "ok"), ("AID.ECHO.v1", "serve", OS_USER, "ok"),
        ("AID.ECHO.v1", "serve", OS_USER, "ok")]
    assert all(r["duration_ms"] == r["duration_us"] / 1000 for r in got)
    # The folder and every file of the store are the user's only.
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for f in folder.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    # The report reads the default store without being told where it is.
    report = subprocess.run([TOOLHOST, "audit", "report", "--format", "json"], capture_output=True, text=True,
                            env=env_for(state), timeout=30)
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["fronts"] == {"run": 1, "serve": 2}


def test_a_run_alone_reaches_the_database_through_the_report(tmp_path: Path) -> None:
    state = tmp_path / "state"
    for _ in range(3):
        assert run_once(state).returncode == 0
    report = subprocess.run([TOOLHOST, "audit", "report", "--format", "json"], capture_output=True, text=True,
                            env=env_for(state), timeout=30)
    assert report.returncode == 0, report.stderr
    r = json.loads(report.stdout)
    assert r["calls"] == 3 and r["fronts"] == {"run": 3}
    assert r["users"] == [{"user": OS_USER, "calls": 3}]


def test_duration_ms_in_the_json_lines(tmp_path: Path) -> None:
    jsonl = tmp_path / "calls.jsonl"
    served = serve_once(tmp_path / "state", "--audit-jsonl", str(jsonl))
    assert served.returncode == 0, served.stderr
    [line] = [json.loads(x) for x in jsonl.read_text().splitlines()]
    assert line["duration_ms"] == line["duration_us"] / 1000 and line["user"] == OS_USER


def test_no_audit_writes_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert run_once(state, "--no-audit").returncode == 0
    assert serve_once(state, "--no-audit").returncode == 0
    assert run_once(state, MACHINA_TOOLHOST_AUDIT="0").returncode == 0
    assert serve_once(state, MACHINA_TOOLHOST_AUDIT="0").returncode == 0
    assert not state.exists()


def test_an_unusable_state_folder_warns_and_serves(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.write_text("a file, not a folder")
    ran = run_once(state)
    assert ran.returncode == 0 and json.loads(ran.stdout)["ok"]
    assert len(ran.stderr.splitlines()) == 1 and "running without the audit database" in ran.stderr, ran.stderr
    assert "(--no-audit: no warning)" in ran.stderr  # (the command line's own wording)
    served = serve_once(state, lines=3)
    assert served.returncode == 0 and [json.loads(x)["ok"] for x in served.stdout.splitlines()] == [True] * 3
    assert len(served.stderr.splitlines()) == 1 and "audit" in served.stderr, served.stderr
    # A store named on purpose that cannot be opened still stops the host.
    named = serve_once(state, "--audit-db", str(state / "x" / "audit.db"))
    assert named.returncode == 2 and "audit store" in named.stderr


def start_http(state: Path, **extra: str) -> tuple[subprocess.Popen[bytes], int]:
    proc = subprocess.Popen([TOOLHOST, "--http", "127.0.0.1:0"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env_for(state, **extra))
    assert proc.stderr is not None
    line = proc.stderr.readline().decode()
    found = re.search(r"serving HTTP on http://\S+:(\d+)", line)
    assert found, line
    return proc, int(found.group(1))


def call_http(port: int, token: str | None = None) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(f"http://127.0.0.1:{port}/tools/AID.ECHO.v1",
                                 data=json.dumps({"payload": {"msg": "hi"}}).encode(), headers=headers)
    with urllib.request.urlopen(req, timeout=10) as resp:
        answer: dict[str, Any] = json.loads(resp.read())
    return answer


def http_users(state: Path, **extra: str) -> list[str | None]:
    proc, port = start_http(state, **extra)
    try:
        assert call_http(port, extra.get("MACHINA_TOOLHOST_HTTP_TOKEN"))["ok"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return [r["user"] for r in call_log(state / "machina-toolhost" / "audit.db")]


def test_http_records_the_peer_or_the_token_identity(tmp_path: Path) -> None:
    assert http_users(tmp_path / "open") == ["peer:127.0.0.1"]
    token = "s3cret-token-" + "x" * 20
    digest = hashlib.sha256(token.encode()).hexdigest()[:12]
    assert http_users(tmp_path / "tok", MACHINA_TOOLHOST_HTTP_TOKEN=token) == [f"token:{digest}"]
    # The token itself is never stored.
    for f in (tmp_path / "tok" / "machina-toolhost").iterdir():
        assert token.encode() not in f.read_bytes()


def test_run_with_the_default_store_stays_cheap(tmp_path: Path) -> None:
    """A --run appends its record to the store's pending file: no database is opened."""
    state = tmp_path / "state"
    assert run_once(state).returncode == 0
    folder = state / "machina-toolhost"
    assert not (folder / "audit.db").exists()
    pending = folder / "audit.db-pending"
    assert pending.stat().st_size > 0 and stat.S_IMODE(pending.stat().st_mode) == 0o600


def test_a_grown_pending_file_is_taken_in_by_the_run_that_finds_it_so(tmp_path: Path) -> None:
    state = tmp_path / "state"
    big = {"aid": "AID.ECHO.v1", "input_json": json.dumps({"msg": "x" * 20_000})}
    runs = 70  # each keeps 16 KiB of its input: past 1 MiB before the last
    for _ in range(runs):
        done = subprocess.run([TOOLHOST, "--run", "AID.ECHO.v1"], input=json.dumps(big), capture_output=True,
                              text=True, env=env_for(state), timeout=30)
        assert done.returncode == 0 and done.stderr == "", done.stderr
    folder = state / "machina-toolhost"
    assert (folder / "audit.db-pending").stat().st_size < 1 << 20
    taken = call_log(folder / "audit.db")
    assert 60 <= len(taken) < runs and {r["front"] for r in taken} == {"run"}
    assert serve_once(state).returncode == 0  # (takes in the rest)
    assert len(call_log(folder / "audit.db")) == runs + 1


def test_a_store_of_the_previous_schema_is_migrated(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert serve_once(state).returncode == 0
    db = state / "machina-toolhost" / "audit.db"
    con = sqlite3.connect(db)
    sql = con.execute("SELECT sql FROM sqlite_master WHERE name = 'call_log'").fetchone()[0]
    con.execute("DROP VIEW call_log")
    con.execute(sql.replace(" c.duration_us / 1000.0 AS duration_ms,", ""))
    con.execute("UPDATE meta SET value = 'machina-toolhost audit 2' WHERE key = 'schema'")
    con.commit()
    con.close()
    assert "duration_ms" not in call_log(db)[0]
    assert serve_once(state).returncode == 0
    got = call_log(db)
    assert len(got) == 2 and all(r["duration_ms"] == r["duration_us"] / 1000 for r in got)
    con = sqlite3.connect(db)
    assert con.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() == ("machina-toolhost audit 3",)
    con.close()


def test_a_default_store_inside_the_tools_root_is_left_with_a_warning(tmp_path: Path) -> None:
    state = tmp_path / "state"
    read = {"aid": "tools.file.read", "input_json": json.dumps({"path": "state/machina-toolhost/audit.db"})}
    served = subprocess.run([TOOLHOST, "--serve", "--packs", "files"], input=json.dumps(read) + "\n",
                            capture_output=True, text=True, timeout=30,
                            env=env_for(state, MACHINA_TOOLHOST_WORKSPACE=str(tmp_path)), cwd=tmp_path)
    assert served.returncode == 0, served.stderr
    assert "lies inside the tools' root" in served.stderr and "without the audit store" in served.stderr
    assert len(served.stderr.splitlines()) == 1
    # A store named on purpose there still stops the host.
    named = subprocess.run([TOOLHOST, "--serve", "--packs", "files", "--audit-db", str(tmp_path / "a.db")],
                           input="", capture_output=True, text=True, timeout=30,
                           env=env_for(state, MACHINA_TOOLHOST_WORKSPACE=str(tmp_path)), cwd=tmp_path)
    assert named.returncode == 2 and "lies inside the tools' root" in named.stderr


def test_a_default_store_that_cannot_record_refuses_no_call(tmp_path: Path) -> None:
    """Unlike a store named on purpose (--audit-required leased by default), the default store
    records what it can: a write it cannot make loses the record, not the call."""
    state = tmp_path / "state"
    ws = tmp_path / "ws"
    ws.mkdir()
    assert run_once(state).returncode == 0
    write = {"aid": "AID.FILE.WRITE.v1", "input_json": json.dumps({"path": "a.txt", "content": "x"})}

    def limited() -> None:  # (the pending file already holds more than 16 bytes: the append fails)
        import resource
        import signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (16, 16))

    done = subprocess.run([TOOLHOST, "--run", "AID.FILE.WRITE.v1"], input=json.dumps(write), capture_output=True,
                          text=True, env=env_for(state, MACHINA_TOOLHOST_WORKSPACE=str(ws)), timeout=30,
                          preexec_fn=limited)
    answer = json.loads(done.stdout)
    assert answer["ok"] and (ws / "a.txt").read_text() == "x", answer
    assert "audit store" in done.stderr and "not recorded" in done.stderr
    # Asked for, the requirement holds for the default store too.
    (ws / "a.txt").unlink()
    done = subprocess.run([TOOLHOST, "--audit-required", "leased", "--run", "AID.FILE.WRITE.v1"],
                          input=json.dumps(write), capture_output=True, text=True,
                          env=env_for(state, MACHINA_TOOLHOST_WORKSPACE=str(ws)), timeout=30, preexec_fn=limited)
    assert json.loads(done.stdout)["code"] == "audit_unavailable"
