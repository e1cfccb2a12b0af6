"""The test session's own process tree, read from /proc: the processes the tests started
and what those started, never anyone else's (another build or test run on the same machine
must not make a test pass or fail). conftest.py makes the test process a child subreaper,
so a process orphaned by a host that died stays in this tree instead of moving to init."""

from __future__ import annotations

import os
from pathlib import Path


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid), or None if the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1])


def alive(pid: int) -> bool:
    s = _stat(pid)
    return s is not None and s[0] != "Z"


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _parents() -> dict[int, int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            s = _stat(int(entry))
            if s is not None and s[0] != "Z":
                parents[int(entry)] = s[1]
    return parents


def children(pid: int) -> list[int]:
    return sorted(p for p, parent in _parents().items() if parent == pid)


def descendants(pid: int | None = None) -> list[int]:
    """Live processes below `pid` (default: this test process), at any depth."""
    root = os.getpid() if pid is None else pid
    by_parent: dict[int, list[int]] = {}
    for p, parent in _parents().items():
        by_parent.setdefault(parent, []).append(p)
    found: list[int] = []
    todo = [root]
    while todo:
        for child in by_parent.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return sorted(found)


def make_this_process_a_subreaper() -> None:
    """Orphans of the processes this one starts become its children (PR_SET_CHILD_SUBREAPER)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
