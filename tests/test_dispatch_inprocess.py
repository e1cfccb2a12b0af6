"""The in-process transport: the same C++ host in this process, the GIL released while a
tool runs (so threads overlap), safe from many threads at once, process isolation from
Python, and the host's counters."""

from __future__ import annotations

import threading
import time
from typing import Any

import machina_dispatch as md
import pytest
from conftest import HANG_GUARD_S, SANITIZED, TOOLHOST, most_at_once, scaled
from dispatch_support import orphans_since, toolhost_processes


@pytest.fixture
def plugins(misbehaving: str) -> list[str]:
    return [misbehaving, str(md.builtin_plugin_path())]


def test_gil_is_released_while_a_tool_runs(plugins: list[str]) -> None:
    t = md.InProcess(plugins)
    outputs: list[Any] = []

    def call() -> None:
        outputs.append(t.call("AID.TEST.SLOW.v1", {"ms": 300, "stamps": 1}).output)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for th in threads:
        th.start()
    # Python keeps running meanwhile.
    spins = 0
    while any(th.is_alive() for th in threads):
        spins += 1
    for th in threads:
        th.join()
    assert len(outputs) == 4 and most_at_once(outputs) == 4, f"the calls did not overlap: {outputs}"
    assert spins > 1000


def test_many_threads_at_once(plugins: list[str]) -> None:
    t = md.InProcess(plugins)
    errors: list[str] = []

    def worker(k: int) -> None:
        state = md.DsState()
        for i in range(300):
            if t.call("AID.ECHO.v1", {"k": k, "i": i}).output != {"k": k, "i": i}:
                errors.append(f"echo {k} {i}")
            r = t.call("AID.STATE.PUT.v1", {"slot": k % 8, "type": "t", "content": [k, i]}, state=state)
            if state[k % 8].content != [k, i] or not r.ok:
                errors.append(f"state {k} {i}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []


def test_process_isolation_from_python(plugins: list[str]) -> None:
    before = toolhost_processes()
    memory: dict[str, Any] = {} if SANITIZED else {"limit_memory_mb": 512}  # ASan cannot run under RLIMIT_AS
    t = md.InProcess(plugins, isolation="process", executable=TOOLHOST, isolation_workers=2, no_network=True, **memory)
    assert t.call("AID.ECHO.v1", [1]).output == [1]
    r = t.call("AID.TEST.CRASH.v1", check=False)
    assert r.code == "tool_crashed" and r.kind == "crash"
    r = t.call("AID.TEST.HANG.v1", timeout=0.2, check=False)
    assert r.code == "timeout"
    r = t.call("AID.TEST.CONNECT.v1", {"port": 9}, check=False)
    assert r.code == "tool_error" and r.error == "socket: Permission denied"
    stats = t.stats()
    assert stats["crashes"] == 1 and stats["timeouts"] == 1
    assert stats["workers_crashed"] == 1 and stats["workers_timed_out"] == 1 and stats["worker_calls"] == 4
    # A crash or a timeout costs the call's own process, not the worker.
    assert stats["workers_started"] == 1 and stats["workers_live"] == 1
    t.close()
    assert not orphans_since(before)
    with pytest.raises(RuntimeError, match="closed"):
        t.call("AID.ECHO.v1", [1])
    # The host object itself refuses isolated calls once closed, without blaming the tool.
    session = md.Session()
    r = md.Host.call(t.host, "AID.ECHO.v1", "[1]", session)  # type: ignore[arg-type]
    assert r.code == "internal_error" and r.error == "internal error: the host is closed"


def test_inline_hang_answers_timeout_when_the_tool_returns(plugins: list[str]) -> None:
    """Inline, the tool runs on the calling thread: the answer is `timeout`, given once
    the tool lets the thread go (here after 400 ms), and the stuck call is counted."""
    t = md.InProcess(plugins)
    started = time.monotonic()
    r = t.call("AID.TEST.SLOW.v1", {"ms": 400}, timeout=0.1, check=False)
    assert r.code == "timeout" and 0.35 < time.monotonic() - started < scaled(HANG_GUARD_S)
    stats = t.stats()
    assert stats["timeouts"] == 1 and stats["stuck_peak"] == 1 and stats["stuck_now"] == 0


def test_limits_need_process_isolation(plugins: list[str]) -> None:
    with pytest.raises(md.HostError, match="isolation='process'"):
        md.InProcess(plugins, no_network=True)
    with pytest.raises(md.HostError, match="isolation must be"):
        md.InProcess(plugins, isolation="container")


def test_host_options_reach_the_core(plugins: list[str]) -> None:
    t = md.InProcess(plugins, max_output_bytes=1000, tool_timeouts_ms={"AID.TEST.SLOW.v1": 50})
    assert t.call("AID.TEST.HUGE.v1", {"bytes": 2000}, check=False).code == "output_too_large"
    tools = {x["aid"]: x for x in t.host.list_tools()}
    assert tools["AID.TEST.SLOW.v1"]["timeout_ms"] == 50
    assert tools["AID.TEST.TIMEOUT_DEFAULT.v1"]["timeout_ms"] == 150


def test_asyncio_in_process(plugins: list[str]) -> None:
    import asyncio

    t = md.InProcess(plugins)

    async def main() -> list[md.ToolResult]:
        return list(await asyncio.gather(*(t.acall("AID.TEST.SLOW.v1", {"ms": 200, "stamps": 1}) for _ in range(4))))

    results = asyncio.run(main())
    assert all(r.ok for r in results) and most_at_once(r.output for r in results) == 4, results


def test_the_one_compiled_call_answers_as_the_pool_does(plugins: list[str]) -> None:
    # InProcess.call is compiled in _core, with no Python twin: every option goes through it
    # and it answers as another transport does.
    assert type(md.InProcess.__dict__["call"]).__name__ == "instancemethod"
    assert not hasattr(md.InProcess, "_call_py")

    def run(call: Any) -> list[Any]:
        state = md.DsState()
        out: list[Any] = [
            call("AID.ECHO.v1", '{"a":1}'),
            call("AID.ECHO.v1"),
            call(aid="AID.ECHO.v1", inputs={"kw": True}),
            call("AID.ECHO.v1", None, check=False),
            call("AID.ECHO.v1", "{bad", check=False),
            call("AID.NOPE.v1", "{}", check=False),
            call("AID.TEST.FAIL.v1", "{}", check=False),
            call("AID.ECHO.v1", '{"k":1}', idempotency_key="k1"),
            call("AID.ECHO.v1", '{"k":1}', idempotency_key="k1"),
            call("AID.ECHO.v1", '{"k":2}', idempotency_key="k1", check=False),
            call("AID.ECHO.v1", '{"t":1}', lease_token="junk"),
            call("AID.STATE.PUT.v1", '{"slot":1,"type":"t","content":[1]}'),
            call("AID.STATE.GET.v1", '{"slot":1}', check=False),  # the state written above is gone
            call("AID.STATE.PUT.v1", {"slot": 2, "type": "t", "content": 2}, state=state),
            call("AID.STATE.GET.v1", {"slot": 2}, state=state),
            call("AID.STATE.GET.v1", {"slot": 2}),  # ... and so is the state sent above
            dict(state),
            call("AID.ECHO.v1", '{"x":1}', state=None, timeout=None),
            call("AID.ECHO.v1", {"d": 1}),
            call("AID.ECHO.v1", '{"x":1}', timeout=5),
            call("AID.ECHO.v1", [float("nan")], check=False),
        ]
        refused: list[tuple[tuple[Any, ...], dict[str, Any], type[Exception]]] = [
                                    (("AID.NOPE.v1", "{}"), {}, md.ToolNotFound),
                                    (("AID.TEST.FAIL.v1",), {"check": True}, md.ToolFailed),
                                    (("AID.ECHO.v1", [float("nan")]), {}, md.InvalidInput),
                                    (("AID.ECHO.v1", {1, 2}), {}, md.InvalidInput),
                                    (("AID.ECHO.v1", "{}"), {"timeout": -1}, ValueError),
                                    (("AID.ECHO.v1", "{}"), {"bogus": 1}, TypeError),
                                    (("AID.ECHO.v1", "{}"), {"idempotency_key": 5}, TypeError),
                                    (("AID.ECHO.v1", "{}", None), {}, TypeError),
                                    (("AID.ECHO.v1",), {"aid": "AID.ECHO.v1"}, TypeError),
                                    ((), {}, TypeError)]
        for args, kwargs, error in refused:
            with pytest.raises(error) as caught:
                call(*args, **kwargs)
            out.append(type(caught.value) if error in (TypeError, ValueError) else str(caught.value))
        return out

    compiled = md.InProcess(plugins)
    with md.Pool(1, plugins=plugins) as pool:
        assert run(compiled.call) == run(pool.call)
    compiled.close()
    with pytest.raises(RuntimeError, match="closed"):
        compiled.call("AID.ECHO.v1", "{}")
