"""Helpers shared by the machina_dispatch tests: making each transport over the same
plugins and environment, and finding host processes in the test session's process tree."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator, Mapping

import machina_dispatch as md
import process_tree
from conftest import TOOLHOST, base_env

TRANSPORTS = ("inprocess", "pool", "spawn")
# The parity suite also runs over NATS (a nats-server and one machina-toolhost --nats host).
PARITY_TRANSPORTS = (*TRANSPORTS, "nats")


@contextlib.contextmanager
def patched_environ(extra: Mapping[str, str]) -> Iterator[None]:
    """os.environ with MACHINA_* cleared and `extra` set (the in-process host reads its
    lease settings from the environment when it is made)."""
    saved = dict(os.environ)
    try:
        for k in [k for k in os.environ if k.startswith("MACHINA_")]:
            del os.environ[k]
        os.environ.update(extra)
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def make_transport(name: str, plugins: list[str], env: Mapping[str, str] | None = None,
                   args: list[str] | None = None, tools: list[str] | None = None,
                   **options: object) -> Iterator[md.Transport]:
    """One transport of each kind over the same plugins, host options and environment.
    `args` are command-line options for the process transports; `options` the same
    settings as in-process keywords."""
    env_full = base_env(dict(env or {}))
    transport: md.Transport
    with contextlib.ExitStack() as stack:
        if name == "inprocess":
            # For as long as the host lives, as for the process transports: its tools read
            # the environment when they run (the file tools' workspace, for one).
            stack.enter_context(patched_environ(dict(env or {})))
            transport = md.InProcess(plugins, tools=tools, executable=TOOLHOST, **options)  # type: ignore[arg-type]
        elif name == "pool":
            transport = md.Pool(1, executable=TOOLHOST, plugins=plugins, tools=tools, args=args, env=env_full)
        elif name == "spawn":
            transport = md.Spawn(TOOLHOST, plugins=plugins, tools=tools, args=args, env=env_full)
        elif name == "nats":
            from nats_support import Front, nats_server

            # Messages up to 16 MiB: the host's own 10 MiB request cap is what refuses a large one.
            url = stack.enter_context(nats_server(jetstream=False, max_payload=16 * 1024 * 1024))
            front_args = [a for p in plugins for a in ("--plugin", p)]
            front_args += [a for t in tools or [] for a in ("--tools", t)]
            stack.enter_context(Front(url, [*front_args, *(args or [])], env=env_full))
            transport = md.Nats(url)
        else:
            raise ValueError(name)
        try:
            yield transport
        finally:
            transport.close()


def toolhost_processes() -> dict[int, tuple[int, str]]:
    """Every live machina-toolhost process of this test session (see process_tree):
    pid -> (parent pid, command line)."""
    found: dict[int, tuple[int, str]] = {}
    for pid in process_tree.descendants():
        cmd = " ".join(process_tree.cmdline(pid))
        info = process_tree._stat(pid)
        if info is not None and "machina-toolhost" in cmd:
            found[pid] = (info[1], cmd)
    return found


def orphans_since(before: Mapping[int, tuple[int, str]], wait_s: float = 3.0) -> dict[int, tuple[int, str]]:
    """machina-toolhost processes of this session that appeared since `before` and are still alive after
    up to `wait_s` (processes may take a moment to exit after their pipes close)."""
    deadline = time.monotonic() + wait_s
    while True:
        new = {pid: info for pid, info in toolhost_processes().items() if pid not in before}
        if not new or time.monotonic() > deadline:
            return new
        time.sleep(0.05)


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    """The process stopped (SIGSTOP: it answers nothing, not even its own timeouts) while
    the block runs, continued after it unless it is gone by then."""
    os.kill(pid, signal.SIGSTOP)
    try:
        end = time.monotonic() + 5  # SIGSTOP takes effect asynchronously
        while True:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "T":
                    break
            if time.monotonic() > end:
                raise AssertionError(f"process {pid} did not stop")
            time.sleep(0.001)
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
