"""Faults through every transport: a tool that crashes, hangs, prints to stdout or
produces huge output, and a host killed in the middle of a call. Each must end in the
expected error type, and no machina-toolhost process may be left behind (checked from
the process table).

The in-process transport runs misbehaving tools with isolation="process": inline, a
crash would take the test process down and a hang would hold its thread.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import machina_dispatch as md
import pytest
from conftest import HANG_GUARD_S, PAST_GUARD_MS, TOOLHOST, base_env, scaled
from dispatch_support import TRANSPORTS, make_transport, toolhost_processes


@pytest.mark.parametrize("name", TRANSPORTS)
def test_crashing_tool(name: str, plugins: list[str], no_orphans: None) -> None:
    with make_transport(name, plugins, isolation="process") as t:
        with pytest.raises(md.ToolCrashed) as caught:
            t.call("AID.TEST.CRASH.v1")
        assert caught.value.kind == "crash"
        if name == "inprocess":  # the worker died; the host answered
            assert caught.value.code == "tool_crashed" and "SIGSEGV" in caught.value.detail
        else:  # the (inline) host process itself died
            assert caught.value.code is None and "was killed by signal 11 (SIGSEGV" in caught.value.detail
        assert t.call("AID.ECHO.v1", [1]).output == [1]  # and the transport goes on


@pytest.mark.parametrize("name", TRANSPORTS)
def test_hanging_tool(name: str, plugins: list[str], no_orphans: None) -> None:
    with make_transport(name, plugins, isolation="process") as t:
        started = time.monotonic()
        with pytest.raises(md.ToolTimeout) as caught:
            t.call("AID.TEST.HANG.v1", timeout=0.3)
        assert isinstance(caught.value, TimeoutError)
        assert caught.value.code == "timeout"  # the host answered on time, in every transport
        assert caught.value.detail == "timeout: AID.TEST.HANG.v1 did not finish within 300 ms"
        assert 0.3 <= time.monotonic() - started < scaled(HANG_GUARD_S)
        assert t.call("AID.ECHO.v1", 2).output == 2


@pytest.mark.parametrize("name", TRANSPORTS)
def test_printing_tool(name: str, plugins: list[str], no_orphans: None) -> None:
    with make_transport(name, plugins, isolation="process") as t:
        assert t.call("AID.TEST.PRINT.v1").output == {"printed": True}
        assert t.call("AID.ECHO.v1", "[3]").output == [3]


@pytest.mark.parametrize("name", TRANSPORTS)
def test_huge_output(name: str, plugins: list[str], no_orphans: None) -> None:
    with make_transport(name, plugins, isolation="process") as t:
        with pytest.raises(md.ToolFault) as caught:
            t.call("AID.TEST.HUGE.v1", {"bytes": 5 * 1024 * 1024})
        assert caught.value.code == "output_too_large"


def _kill_soon(pids: Callable[[], list[int]], delay: float) -> threading.Thread:
    def kill() -> None:
        time.sleep(delay)
        for pid in pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    thread = threading.Thread(target=kill)
    thread.start()
    return thread


def _children(pid: int) -> list[int]:
    return [p for p, (ppid, _) in toolhost_processes().items() if ppid == pid]


def test_host_killed_mid_call_pool(plugins: list[str], no_orphans: None) -> None:
    with make_transport("pool", plugins) as t:
        assert isinstance(t, md.Pool)
        t.call("AID.ECHO.v1", 0)
        # Several calls pending on the one host process when it is killed: all fail at
        # once with crash (long before their tool or their deadline ends them), and the pool recovers.
        results: list[md.ToolResult] = []
        threads = [threading.Thread(target=lambda: results.append(
            t.call("AID.TEST.SLOW.v1", {"ms": PAST_GUARD_MS}, timeout=PAST_GUARD_MS / 1000 + 5, check=False)))
            for _ in range(3)]
        started = time.monotonic()
        for th in threads:
            th.start()
        killer = _kill_soon(t.pids, 0.5)
        for th in threads:
            th.join()
        killer.join()
        assert time.monotonic() - started < scaled(HANG_GUARD_S)
        assert len(results) == 3 and all(r.kind == "crash" for r in results), results
        assert all("was killed by signal 9 (SIGKILL" in r.error for r in results)
        assert t.call("AID.ECHO.v1", 1).output == 1


def test_host_killed_mid_call_pool_asyncio(plugins: list[str], no_orphans: None) -> None:
    # The same for asyncio calls, read by the event loop from a process of their own.
    with make_transport("pool", plugins) as t:
        assert isinstance(t, md.Pool)

        async def main() -> tuple[list[md.ToolResult], float]:
            await t.acall("AID.ECHO.v1", 0)
            started = time.monotonic()
            killer = _kill_soon(t.pids, 0.5)
            results = await asyncio.gather(*[t.acall("AID.TEST.SLOW.v1", {"ms": PAST_GUARD_MS},
                                                     timeout=PAST_GUARD_MS / 1000 + 5, check=False)
                                             for _ in range(3)])
            elapsed = time.monotonic() - started
            killer.join()
            assert (await t.acall("AID.ECHO.v1", 1)).output == 1
            return results, elapsed

        results, elapsed = asyncio.run(main())
        assert elapsed < scaled(HANG_GUARD_S)
        assert [r.kind for r in results] == ["crash"] * 3, results
        assert all("was killed by signal 9 (SIGKILL" in r.error for r in results)


def test_host_killed_mid_batch_pool(plugins: list[str], no_orphans: None) -> None:
    # A batch's calls pending when the host is killed: the answered ones keep their
    # results, every other one fails with crash at once, in order; the pool recovers.
    with md.Pool(1, workers=4, executable=TOOLHOST, plugins=plugins, env=base_env()) as t:
        t.call("AID.ECHO.v1", 0)
        slow = md.Call("AID.TEST.SLOW.v1", {"ms": PAST_GUARD_MS}, timeout=PAST_GUARD_MS / 1000 + 5)
        calls = [md.Call("AID.ECHO.v1", i) for i in range(50)] + [slow] * 20
        killer = _kill_soon(t.pids, 0.5)
        started = time.monotonic()
        results = t.call_many([*calls, md.Call("AID.ECHO.v1", "last")], check=False)
        killer.join()
        assert time.monotonic() - started < scaled(HANG_GUARD_S)
        assert [r.output for r in results[:50]] == list(range(50))
        assert len(results) == 71 and all(r.kind == "crash" for r in results[50:]), results[50:]
        assert all("was killed by signal 9 (SIGKILL" in r.error for r in results[50:])
        assert t.call("AID.ECHO.v1", 1).output == 1


def test_host_killed_mid_call_spawn(plugins: list[str], no_orphans: None) -> None:
    with make_transport("spawn", plugins) as t:
        me = os.getpid()
        killer = _kill_soon(lambda: _children(me), 0.5)
        r = t.call("AID.TEST.SLOW.v1", {"ms": 5000}, timeout=20, check=False)
        killer.join()
        assert r.kind == "crash" and "was killed by signal 9 (SIGKILL" in r.error


def test_worker_killed_mid_call_inprocess(plugins: list[str], no_orphans: None) -> None:
    with make_transport("inprocess", plugins, isolation="process") as t:
        t.call("AID.ECHO.v1", 0)  # starts a worker
        me = os.getpid()
        killer = _kill_soon(lambda: _children(me), 0.5)
        r = t.call("AID.TEST.SLOW.v1", {"ms": 5000}, timeout=20, check=False)
        killer.join()
        assert r.code == "tool_crashed" and "was killed by signal 9 (SIGKILL" in r.error
        assert t.call("AID.ECHO.v1", 1).output == 1


@pytest.mark.parametrize("name", ["pool", "spawn"])
def test_host_that_cannot_start(name: str, tmp_path: Path, no_orphans: None) -> None:
    # Found where the transport is made (the host is asked to list its tools), not at the
    # first call; the dispatch function, which checks nothing first, reports a crash.
    with pytest.raises(md.HostError, match="exited with status 2.*missing.so"):
        with make_transport(name, [str(tmp_path / "missing.so")]):
            pass
    out = md.run_machina_toolhost("AID.ECHO.v1", plugins=[str(tmp_path / "missing.so")])
    assert isinstance(out, dict), out
    assert out["type"] == "crash" and "exited with status 2" in out["detail"] and "missing.so" in out["detail"]
