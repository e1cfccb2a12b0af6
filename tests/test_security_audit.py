"""The audit store under attack: it does not fail open (a store that cannot record refuses
leased calls, and every call with --audit-required all), it keeps no credential an input
carried, and its files are readable by their owner only."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sqlite3
import stat
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import machina_dispatch as md
import pytest
from conftest import TOOLHOST, base_env

WRITE = "AID.FILE.WRITE.v1"  # tier 1
ECHO = "AID.ECHO.v1"  # tier 0


class ServeHost:
    """A `--serve` host answering one request line at a time."""

    def __init__(self, *args: str, cwd: Path, umask: int | None = None) -> None:
        self.proc = subprocess.Popen(
            [TOOLHOST, "--serve", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=cwd, env=base_env({"MACHINA_TOOLHOST_WORKSPACE": str(cwd)}),
            preexec_fn=(lambda: os.umask(umask)) if umask is not None else None)  # noqa: PLW1509

    def call(self, aid: str, input_obj: Any) -> dict[str, Any]:
        stdin: IO[bytes] = self.proc.stdin  # type: ignore[assignment]
        stdout: IO[bytes] = self.proc.stdout  # type: ignore[assignment]
        stdin.write((json.dumps({"aid": aid, "input_json": json.dumps(input_obj)}) + "\n").encode())
        stdin.flush()
        line = stdout.readline()
        assert line, self.proc.stderr.read().decode() if self.proc.stderr else ""
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> str:
        out, err = self.proc.communicate(timeout=30)
        assert self.proc.returncode == 0, err.decode()
        return err.decode()


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs of its own (the test is skipped where mounting is not permitted)."""
    where = tmp_path / "small"
    where.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(where)],
                          capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(fs: Path, name: str = "filler") -> Path:
    """Fills the file system; returns the file that holds the space."""
    filler = fs / name
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        chunk = b"\0" * 4096
        with contextlib.suppress(OSError):
            while os.write(fd, chunk) > 0:
                pass
    finally:
        os.close(fd)
    with pytest.raises(OSError) as caught:
        fd = os.open(fs / "probe", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.write(fd, b"\0" * 8192)
        finally:
            os.close(fd)
    assert caught.value.errno == errno.ENOSPC
    (fs / "probe").unlink(missing_ok=True)
    return filler


def fail_the_store(host: ServeHost, fs: Path) -> dict[str, Any]:
    """Fills the store's file system and makes calls until one leased call is refused;
    returns its answer. Each call's input is new (its digest a new row). The file system
    is filled again after (what a failed write gave back: a JSON lines file cut back to
    its last whole line)."""
    fill(fs)
    for i in range(64):
        host.call(ECHO, {"path": f"{i}-{uuid.uuid4().hex}" + "p" * 900})
        r = host.call(WRITE, {"path": "leased.txt", "content": f"attempt {i}"})
        if not r["ok"]:
            fill(fs, "filler2")
            return r
    pytest.fail("the store's file system is full, yet every leased call was answered")


def free(fs: Path) -> None:
    for name in ("filler", "filler2"):
        (fs / name).unlink(missing_ok=True)


def test_a_store_that_cannot_record_refuses_leased_calls_until_it_can(small_fs: Path, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    db = small_fs / "calls.db"
    host = ServeHost("--audit-db", str(db), cwd=ws)
    try:
        assert host.call(WRITE, {"path": "leased.txt", "content": "before"})["ok"]
        refused = fail_the_store(host, small_fs)
        assert refused["code"] == "audit_unavailable", refused
        assert refused["status"] == "TOOL_ERROR"
        assert refused["error"].startswith("audit_unavailable: the audit store cannot record"), refused["error"]
        # Refused before it runs while the store stays full: the tool does not run.
        written = (ws / "leased.txt").read_text()
        again = host.call(WRITE, {"path": "leased.txt", "content": "must not be written"})
        assert again["code"] == "audit_unavailable"
        assert (ws / "leased.txt").read_text() == written
        # Calls of tier 0 are still answered (--audit-required leased, the default).
        assert host.call(ECHO, {"n": 1})["ok"]
        # Space again: the next leased call is answered, and recorded.
        free(small_fs)
        after = host.call(WRITE, {"path": "leased.txt", "content": "after"})
        assert after["ok"], after
        assert (ws / "leased.txt").read_text() == "after"
    finally:
        err = host.close()
    assert "audit store" in err  # the operator is told, too
    con = sqlite3.connect(db)
    try:
        rows = con.execute("SELECT tool, code, args FROM call_log ORDER BY id").fetchall()
    finally:
        con.close()
    assert rows[0][:2] == (WRITE, "ok")
    assert rows[-1][:2] == (WRITE, "ok") and json.loads(rows[-1][2])["path"] == "leased.txt"


def test_a_json_lines_store_answers_a_leased_call_only_once_its_line_is_written(small_fs: Path,
                                                                                  tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    jsonl = small_fs / "calls.jsonl"
    host = ServeHost("--audit-jsonl", str(jsonl), cwd=ws)
    try:
        assert host.call(WRITE, {"path": "leased-first.txt", "content": "x"})["ok"]
        fill(small_fs)
        answers = {}
        for i in range(48):
            host.call(ECHO, {"path": f"{i}-{uuid.uuid4().hex}" + "p" * 900})
            answers[f"leased-{i:02d}.txt"] = host.call(WRITE, {"path": f"leased-{i:02d}.txt", "content": "x"})
        free(small_fs)
        assert host.call(WRITE, {"path": "leased-after.txt", "content": "x"})["ok"]
    finally:
        host.close()
    refused = {p: a for p, a in answers.items() if not a["ok"]}
    assert refused and {a["code"] for a in refused.values()} == {"audit_unavailable"}, answers
    for path, a in refused.items():
        if a["error"].endswith("is not run until it can"):
            assert not (ws / path).exists()  # refused before it ran
    # Every answered leased call has its line (a full disk cuts no line in two).
    lines = [json.loads(x) for x in jsonl.read_text().splitlines()]
    recorded = {x["path"] for x in lines if x["tool"] == WRITE and x["code"] == "ok"}
    answered = {p for p, a in answers.items() if a["ok"]} | {"leased-first.txt", "leased-after.txt"}
    assert answered <= recorded, answered - recorded


def test_audit_required_all_refuses_every_call_and_none_answers_every_call(small_fs: Path, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    host = ServeHost("--audit-db", str(small_fs / "all.db"), "--audit-required", "all", cwd=ws)
    try:
        assert host.call(ECHO, {"n": 0})["ok"]
        fill(small_fs)
        answers = [host.call(ECHO, {"path": f"{i}-{uuid.uuid4().hex}" + "p" * 900}) for i in range(64)]
        codes = [a.get("code") for a in answers]
        assert "audit_unavailable" in codes, codes
        first = codes.index("audit_unavailable")
        assert set(codes[first:]) == {"audit_unavailable"}, codes  # no call answered while it cannot record
        (small_fs / "filler").unlink()
        assert host.call(ECHO, {"n": 2})["ok"]
    finally:
        host.close()
    for f in small_fs.iterdir():
        f.unlink()
    host = ServeHost("--audit-db", str(small_fs / "none.db"), "--audit-required", "none", cwd=ws)
    try:
        assert host.call(ECHO, {"n": 0})["ok"]  # (the store is set up)
        fill(small_fs)
        for i in range(32):
            assert host.call(ECHO, {"path": f"{i}-{uuid.uuid4().hex}" + "p" * 900})["ok"]
            assert host.call(WRITE, {"path": "none.txt", "content": str(i)})["ok"]
    finally:
        host.close()


def test_audit_required_takes_only_its_three_values(tmp_path: Path) -> None:
    proc = subprocess.run([TOOLHOST, "--serve", "--audit-db", str(tmp_path / "x.db"), "--audit-required", "some"],
                          input=b"", capture_output=True, timeout=30, env=base_env())
    assert proc.returncode != 0
    assert "--audit-required" in proc.stderr.decode()


def test_the_python_binding_takes_the_requirement_and_raises_audit_unavailable(small_fs: Path,
                                                                                 tmp_path: Path) -> None:
    with pytest.raises(md.HostError, match="audit_required must be 'leased', 'all' or 'none', not 'some'"):
        md.InProcess(audit_db=str(tmp_path / "x.db"), audit_required="some")
    with md.InProcess(audit_db=str(small_fs / "py.db"), audit_required="all") as inproc:
        assert inproc.call(ECHO, {"n": 0}).ok
        fill(small_fs)
        with pytest.raises(md.AuditUnavailable) as caught:  # noqa: PT012
            for i in range(64):
                inproc.call(ECHO, {"path": f"{i}-{uuid.uuid4().hex}" + "p" * 900})
        assert caught.value.code == "audit_unavailable"
        assert caught.value.detail.startswith("audit_unavailable: the audit store cannot record")
        (small_fs / "filler").unlink()
        assert inproc.call(ECHO, {"n": 1}).ok


# --- credentials and file modes ------------------------------------------------------

CREDENTIAL_INPUTS: list[tuple[dict[str, Any], list[str], list[str]]] = [
    # (input, secrets that must not be stored, what must still be there)
    ({"url": "https://alice:S3CRET-URL@example.com/repo.git"}, ["S3CRET-URL"], ["alice", "example.com/repo.git"]),
    ({"package": "git+https://bob:S3CRET-PKG@git.example.org/pkg.git#egg=pkg"}, ["S3CRET-PKG"],
     ["bob", "git.example.org/pkg.git"]),
    ({"command": "pip install --index-url https://u:S3CRET-IDX@pypi.example/simple foo"}, ["S3CRET-IDX"],
     ["pip install", "pypi.example/simple foo"]),
    ({"command": "tool --password=S3CRET-EQ --password S3CRET-SP --token S3CRET-TOK -v"},
     ["S3CRET-EQ", "S3CRET-SP", "S3CRET-TOK"], ["--password", "--token", "-v"]),
    ({"command": "curl -H 'Authorization: Bearer S3CRET-BEARER' https://api.example/v1"}, ["S3CRET-BEARER"],
     ["Authorization: Bearer", "https://api.example/v1"]),
    ({"command": "curl", "args": ["-H", "Authorization: Bearer S3CRET-ARG1", "--password", "S3CRET-ARG2",
                                  "--api-key=S3CRET-ARG3", "https://x.example/y"]},
     ["S3CRET-ARG1", "S3CRET-ARG2", "S3CRET-ARG3"], ["https://x.example/y", "--password", "--api-key="]),
    ({"query": "https://h.example/p?token=S3CRET-Q1&page=2&api_key=S3CRET-Q2&password=S3CRET-Q3&secret=S3CRET-Q4"},
     ["S3CRET-Q1", "S3CRET-Q2", "S3CRET-Q3", "S3CRET-Q4"], ["page=2", "h.example/p"]),
    ({"command": "mysql -u root -pS3CRET-MYSQL shop"}, ["S3CRET-MYSQL"], ["mysql -u root -p", "shop"]),
    ({"command": "mkdir -p build && gen --max_tokens=100 --access_token S3CRET-AT"}, ["S3CRET-AT"],
     ["mkdir -p build", "--max_tokens=100"]),
]


def store_text(where: Path) -> str:
    return "".join(f.read_bytes().decode("latin-1") for f in where.iterdir() if f.is_file())


def test_credentials_in_a_call_are_not_stored(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    audit = tmp_path / "audit"
    audit.mkdir()
    db, jsonl = audit / "calls.db", audit / "calls.jsonl"
    host = ServeHost("--audit-db", str(db), "--audit-jsonl", str(jsonl), cwd=ws)
    try:
        for input_obj, _, _ in CREDENTIAL_INPUTS:
            assert host.call(ECHO, input_obj)["ok"]
    finally:
        host.close()
    con = sqlite3.connect(db)
    try:
        stored = [r[0] for r in con.execute("SELECT args FROM call_log ORDER BY id")]
    finally:
        con.close()
    lines = [json.loads(x) for x in jsonl.read_text().splitlines()]
    assert len(stored) == len(lines) == len(CREDENTIAL_INPUTS)
    everything = store_text(audit)
    for (input_obj, secrets, kept), args, line in zip(CREDENTIAL_INPUTS, stored, lines, strict=True):
        for secret in secrets:
            assert secret not in args, (input_obj, args)
            assert secret not in json.dumps(line), (input_obj, line)
            assert secret not in everything, secret
        for text in kept:
            assert text in args, (text, args)
        assert "***" in args
        assert json.loads(args) == line["args"]


def test_the_store_files_are_its_owners_only(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    audit = tmp_path / "audit"
    audit.mkdir()
    db, jsonl = audit / "calls.db", audit / "calls.jsonl"
    host = ServeHost("--audit-db", str(db), "--audit-jsonl", str(jsonl), "--audit-jsonl-max-mb", "1", cwd=ws,
                     umask=0)
    try:
        # Past 1 MiB of lines: the JSON lines file is rotated.
        for i in range(900):
            assert host.call(ECHO, {"path": f"{i:04d}" + "p" * 1100})["ok"]
        files = {f.name: stat.S_IMODE(f.stat().st_mode) for f in audit.iterdir()}  # (the WAL goes at the end)
    finally:
        host.close()
    files.update({f.name: stat.S_IMODE(f.stat().st_mode) for f in audit.iterdir()})
    assert {"calls.db", "calls.db-wal", "calls.db-shm", "calls.jsonl", "calls.jsonl.1"} <= set(files), files
    assert all(mode == 0o600 for mode in files.values()), {k: oct(v) for k, v in files.items()}


def test_an_existing_store_is_made_its_owners_only(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    db, jsonl = tmp_path / "old.db", tmp_path / "old.jsonl"
    for f in (db, jsonl):
        f.touch()
        f.chmod(0o644)
    host = ServeHost("--audit-db", str(db), "--audit-jsonl", str(jsonl), cwd=ws)
    try:
        assert host.call(ECHO, {"n": 1})["ok"]
    finally:
        host.close()
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert stat.S_IMODE(jsonl.stat().st_mode) == 0o600
