"""The file pack's tools never leave their workspace (a red team found that they did):
no symbolic link is followed anywhere in a path (not to /etc/passwd, not to another
directory, not to /proc/self/environ, not dangling), no write lands outside even while a
parent directory is swapped for a link thousands of times, hard links are refused before
anything is truncated, a NUL in a path is refused rather than cut, a failed write leaves
nothing it made behind, and a FIFO is refused instead of holding the caller."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import LEASE_SECRET, TOOLHOST, base_env

SYMLINK = "a symbolic link is in the way (links are not followed in the workspace)"
HARD_LINK = "it has more than one hard link (a hard link may lead out of the workspace)"


def call(ws: Path, aid: str, *args: str, **inputs: Any) -> dict[str, Any]:
    proc = subprocess.run(
        [TOOLHOST, *args, "--run", aid],
        input=json.dumps({"input_json": json.dumps(inputs)}).encode(),
        capture_output=True,
        timeout=30,
        env=base_env({"MACHINA_TOOLHOST_WORKSPACE": str(ws)}),
    )
    assert proc.returncode == 0, proc.stderr
    r: dict[str, Any] = json.loads(proc.stdout)
    return r


def read(ws: Path, path: str) -> dict[str, Any]:
    return call(ws, "AID.FILE.READ.v1", path=path)


def write(ws: Path, path: str, content: str = "x", **extra: Any) -> dict[str, Any]:
    return call(ws, "AID.FILE.WRITE.v1", path=path, content=content, **extra)


SERVICE_ERROR_TYPE = {"access_denied": "AccessDenied", "target_not_found": "NotFound", "invalid_input": "InvalidInput"}


def refused(r: dict[str, Any], verb: str, path: str, why: str, code: str = "access_denied") -> None:
    """A refusal of the file pack: the service error type, the path, why; our code."""
    assert r["ok"] is False and r["code"] == code, (verb, r)
    assert r["error"] == f"{SERVICE_ERROR_TYPE[code]}: {path}: {why}", r["error"]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "ws").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("outside secret\n")
    return tmp_path / "ws"


def test_reads_follow_no_symbolic_link(ws: Path) -> None:
    outside = ws.parent / "outside"
    (ws / "passwd").symlink_to("/etc/passwd")
    (ws / "environ").symlink_to("/proc/self/environ")
    (ws / "out").symlink_to(outside)
    (ws / "rel").symlink_to("../outside/secret.txt")
    for path in ("passwd", "environ", "out/secret.txt", "rel"):
        refused(read(ws, path), "read", path, SYMLINK)


def test_the_lease_secret_is_not_readable_through_proc(ws: Path) -> None:
    (ws / "environ").symlink_to("/proc/self/environ")
    r = call(ws, "AID.FILE.READ.v1", path="environ")
    assert LEASE_SECRET not in json.dumps(r)
    refused(r, "read", "environ", SYMLINK)


def test_writes_follow_no_symbolic_link(ws: Path) -> None:
    outside = ws.parent / "outside"
    (ws / "file-link").symlink_to(outside / "secret.txt")
    (ws / "dir-link").symlink_to(outside)
    (ws / "dangling").symlink_to(outside / "new.txt")
    refused(write(ws, "file-link"), "write", "file-link", SYMLINK)
    refused(write(ws, "dir-link/new.txt"), "write", "dir-link/new.txt", SYMLINK)
    refused(write(ws, "dir-link/deeper/new.txt"), "write", "dir-link/deeper/new.txt", SYMLINK)
    refused(write(ws, "dangling"), "write", "dangling", SYMLINK)
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "outside secret\n"


def test_hard_links_are_refused_before_anything_is_truncated(ws: Path) -> None:
    outside = ws.parent / "outside" / "secret.txt"
    os.link(outside, ws / "linked")
    refused(write(ws, "linked", "overwritten"), "write", "linked", HARD_LINK)
    refused(write(ws, "linked", "more", append=True), "write", "linked", HARD_LINK)
    refused(read(ws, "linked"), "read", "linked", HARD_LINK)
    assert outside.read_text() == "outside secret\n"


@pytest.mark.parametrize(
    ("path", "code", "error"),
    [
        ("..\u0000/x", "invalid_input", "InvalidInput: path must not contain a NUL character"),
        ("a\u0000b", "invalid_input", "InvalidInput: path must not contain a NUL character"),
        ("../outside/secret.txt", "access_denied",
         "AccessDenied: ../outside/secret.txt: '..' is not allowed in a path"),
        ("/etc/passwd", "access_denied", "AccessDenied: /etc/passwd is outside the allowed directories"),
        (".", "invalid_input", "InvalidInput: . names a directory the tools work in, not a file in it"),
        ("/".join(["d"] * 65), "invalid_input",
         "InvalidInput: " + "/".join(["d"] * 65) + ": path has more than 64 parts"),
        ("n" * 256, "invalid_input", "InvalidInput: " + "n" * 200 + "...: a part of the path is longer than 255 bytes"),
    ],
)
def test_paths_that_could_lead_out_are_refused(ws: Path, path: str, code: str, error: str) -> None:
    r = write(ws, path)
    assert r["ok"] is False and r["code"] == code and r["error"] == error, r
    assert list(ws.iterdir()) == []


def test_a_fifo_is_refused_without_waiting(ws: Path) -> None:
    os.mkfifo(ws / "fifo")
    refused(read(ws, "fifo"), "read", "fifo", "not a regular file")
    refused(write(ws, "fifo"), "write", "fifo", "not a regular file")
    (ws / "dir").mkdir()
    refused(read(ws, "dir"), "read", "dir", "not a regular file")


def test_a_failed_write_leaves_nothing_it_made(ws: Path) -> None:
    # A host limited to 1 KiB files (SIGXFSZ ignored, so the write fails with EFBIG): the
    # write of 4 KiB through ten new folders fails, and neither the file nor a folder stays.
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))

    (ws / "keep").mkdir()
    path = "keep/" + "/".join(f"new{i}" for i in range(10)) + "/file.txt"
    proc = subprocess.run(
        [TOOLHOST, "--run", "AID.FILE.WRITE.v1"],
        preexec_fn=limit,
        capture_output=True,
        input=json.dumps({"input_json": json.dumps({"path": path, "content": "y" * 4096})}).encode(),
        env=base_env({"MACHINA_TOOLHOST_WORKSPACE": str(ws)}),
        timeout=30,
    )
    r = json.loads(proc.stdout)
    assert r["code"] == "system_error" and r["error"].startswith(f"SystemError: {path}: write failed: "), r
    assert [p.name for p in ws.iterdir()] == ["keep"] and list((ws / "keep").iterdir()) == []
    # An existing file that fails the same way is not removed.
    (ws / "keep" / "old.txt").write_text("old")
    r = json.loads(
        subprocess.run(
            [TOOLHOST, "--run", "AID.FILE.WRITE.v1"],
            preexec_fn=limit,
            capture_output=True,
            input=json.dumps(
                {"input_json": json.dumps({"path": "keep/old.txt", "content": "y" * 4096, "append": True})}
            ).encode(),
            env=base_env({"MACHINA_TOOLHOST_WORKSPACE": str(ws)}),
            timeout=30,
        ).stdout
    )
    assert r["code"] == "system_error" and (ws / "keep" / "old.txt").exists()


def exchange(a: Path, b: Path) -> None:
    """Swaps two names atomically (renameat2 RENAME_EXCHANGE): at every instant `a` is one
    of the two, never missing."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(-100, bytes(a), -100, bytes(b), 2) != 0:  # AT_FDCWD, RENAME_EXCHANGE
        raise OSError(ctypes.get_errno(), "renameat2")


def test_writes_stay_inside_while_a_parent_is_swapped_for_a_link(ws: Path) -> None:
    outside = ws.parent / "outside"
    sub, other = ws / "sub", ws / "other"
    sub.mkdir()
    other.symlink_to(outside)
    stop = threading.Event()
    swaps = 0

    def swap() -> None:  # sub is the folder, then a link to outside, then the folder again, ...
        nonlocal swaps
        while not stop.is_set():
            exchange(sub, other)
            swaps += 1
        if swaps % 2:
            exchange(sub, other)  # end with sub the folder

    n = 3000
    lines = b"".join(
        json.dumps(
            {
                "id": i,
                "aid": "AID.FILE.WRITE.v1",
                "input_json": json.dumps({"path": f"sub/f{i}.txt", "content": str(i)}),
            }
        ).encode()
        + b"\n"
        for i in range(n)
    )
    swapper = threading.Thread(target=swap)
    swapper.start()
    try:
        proc = subprocess.run(
            [TOOLHOST, "--serve"],
            input=lines,
            capture_output=True,
            timeout=120,
            env=base_env({"MACHINA_TOOLHOST_WORKSPACE": str(ws)}),
        )
    finally:
        stop.set()
        swapper.join()
    out = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(out) == n and swaps > 100, (len(out), swaps)
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"], "a write landed outside the workspace"
    written = [r for r in out if r["ok"]]
    for r in out:
        if not r["ok"]:  # the only way a write may fail here: it met the link
            assert r["error"].endswith(SYMLINK), r["error"]
    # Every write that succeeded is in the workspace's own folder, and both outcomes happened.
    assert 0 < len(written) < n and len(written) == len(list(sub.iterdir()))


def test_normal_files_still_work(ws: Path) -> None:
    assert write(ws, "a/b/c.txt", "one ")["ok"] is True
    assert write(ws, "a/b/c.txt", "two", append=True)["ok"] is True
    r = read(ws, "a//b/./c.txt")
    assert r["ok"] is True and json.loads(r["output_json"]) == {
        "path": "a//b/./c.txt",
        "content": "one two",
        "truncated": False,
        "size": 7,
    }
    assert write(ws, "a/b/c.txt", "new")["ok"] is True
    assert (ws / "a" / "b" / "c.txt").read_text() == "new"
    refused(read(ws, "a/missing.txt"), "read", "a/missing.txt", "No such file or directory", "target_not_found")
    refused(write(ws, "a/b/c.txt/d"), "write", "a/b/c.txt/d", "a part of it is not a directory", "target_not_found")
