"""asyncio at full speed, with every guarantee kept: the pool's acall is a future (no task
per call) whose requests are written once per loop iteration, the request window holds
with calls queued in order, a queued call still times out at its deadline, a cancelled one
is never sent, and InProcess.acall never blocks the event loop while a tool runs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import machina_dispatch as md
import pytest
from conftest import HANG_GUARD_S, TOOLHOST, base_env, most_at_once, scaled
from dispatch_support import stopped


async def every(seconds: float, do: Callable[[], None]) -> None:
    """Runs `do` every `seconds` on the loop until cancelled (a probe of the loop's state)."""
    while True:
        do()
        await asyncio.sleep(seconds)


def pool(plugins: list[str], **kw: object) -> md.Pool:
    return md.Pool(executable=TOOLHOST, plugins=plugins, env=base_env(), **kw)  # type: ignore[arg-type]


def test_gather_and_acall_many_answer_every_call_in_order(plugins: list[str], no_orphans: None) -> None:
    async def main() -> None:
        async with pool(plugins, processes=2, max_in_flight=64) as p:
            futures = [p.acall("AID.ECHO.v1", {"i": i}) for i in range(3000)]
            assert all(isinstance(f, asyncio.Future) for f in futures)  # no task per call
            got = await asyncio.gather(*futures)
            assert [r.output for r in got] == [{"i": i} for i in range(3000)]
            many = await p.acall_many(("AID.ECHO.v1", i) for i in range(3000))
            assert [r.output for r in many] == list(range(3000))
            # Mixed: a batch and single calls at once, through the same window.
            batch = p.acall_many(("AID.ECHO.v1", i) for i in range(500))
            singles = [p.acall("AID.ECHO.v1", -i) for i in range(500)]
            done = await asyncio.gather(batch, *singles)
            assert [r.output for r in done[0]] == list(range(500))
            assert [r.output for r in done[1:]] == [-i for i in range(500)]
    asyncio.run(main())


def test_check_raises_from_the_await_and_state_is_applied(plugins: list[str], no_orphans: None) -> None:
    async def main() -> None:
        async with pool(plugins) as p:
            with pytest.raises(md.ToolNotFound):
                await p.acall("AID.NOPE.v1")
            r = await p.acall("AID.NOPE.v1", check=False)
            assert r.kind == "tool_not_found" and r.status == "INVALID_PICK"
            with pytest.raises(md.InvalidInput):  # not JSON: refused, raised where awaited
                await p.acall("AID.ECHO.v1", {1, 2})
            refused = await p.acall("AID.ECHO.v1", {1, 2}, check=False)
            assert refused.kind == "invalid_input" and refused.status == "INVALID_PICK"
            state = md.DsState()
            await p.acall("AID.STATE.PUT.v1", {"slot": 1, "type": "t", "content": 5}, state=state)
            assert state["DS1"].content == 5
            many = await p.acall_many([md.Call("AID.STATE.PUT.v1", {"slot": 2, "type": "t", "content": 6},
                                               state=state)])
            assert many[0].ok and state["DS2"].content == 6
    asyncio.run(main())


def test_the_window_holds_and_queued_calls_go_in_order(plugins: list[str], no_orphans: None) -> None:
    async def main() -> None:
        async with pool(plugins, workers=4, max_in_flight=2) as p:
            await p.acall("AID.ECHO.v1", 0)
            proc = p._solo
            assert proc is not None
            peaks = [0]
            watcher = asyncio.ensure_future(every(0.002, lambda: peaks.append(len(proc.pending))))
            started = time.monotonic()
            slow = await asyncio.gather(*(p.acall("AID.TEST.SLOW.v1", {"ms": 100}) for _ in range(6)))
            elapsed = time.monotonic() - started
            watcher.cancel()
            assert all(r.ok for r in slow)
            assert max(peaks) == 2
            assert elapsed >= 0.29  # three rounds of two, though the host has four workers
    asyncio.run(main())


def test_a_queued_call_times_out_at_its_deadline(plugins: list[str], no_orphans: None) -> None:
    async def main() -> None:
        async with pool(plugins, max_in_flight=1) as p:
            blocker = asyncio.ensure_future(p.acall("AID.TEST.SLOW.v1", {"ms": 1500}))
            await asyncio.sleep(0.1)
            one = await p.acall("AID.ECHO.v1", 1, timeout=0.2, check=False)
            batch = await p.acall_many([md.Call("AID.ECHO.v1", i, timeout=0.2) for i in range(3)], check=False)
            assert one.kind == "timeout" and "no room in the host's request window" in one.error
            assert [r.kind for r in batch] == ["timeout"] * 3
            assert not blocker.done()  # at their deadlines, not when the blocker ends
            assert (await blocker).ok
            assert (await p.acall("AID.ECHO.v1", 2)).output == 2
    asyncio.run(main())


def test_a_cancelled_queued_call_is_never_sent(plugins: list[str], no_orphans: None) -> None:
    async def main() -> None:
        async with pool(plugins, max_in_flight=1) as p:
            blocker = p.acall("AID.TEST.SLOW.v1", {"ms": 300})
            queued = p.acall("AID.TEST.SLOW.v1", {"ms": 2000})
            await asyncio.sleep(0.05)
            queued.cancel()
            assert (await blocker).ok
            assert (await p.acall("AID.ECHO.v1", 1)).output == 1
            # The host's one worker counts the calls it ran: the blocker and this one. Had the
            # cancelled call been sent, it would have run in between.
            assert (await p.acall("AID.TEST.SLOW.v1", {"ms": 0})).output["calls"] == 2
    asyncio.run(main())


def test_a_call_sent_from_the_queue_is_still_watched_past_its_deadline(plugins: list[str], no_orphans: None) -> None:
    # A queued call has one watch entry, at its deadline. Sent meanwhile and unanswered
    # then, it still gets the grace period, and after it the host is taken as wedged.
    async def main() -> None:
        async with pool(plugins, workers=2, max_in_flight=1, grace=0.3) as p:
            await p.acall("AID.ECHO.v1", 0)
            [pid] = p.pids()
            started = time.monotonic()
            blocker = p.acall("AID.TEST.SLOW.v1", {"ms": 150})
            queued = p.acall("AID.TEST.SLOW.v1", {"ms": 600}, timeout=1.0, check=False)
            assert (await blocker).ok
            await asyncio.sleep(0.2)  # the queued call is in the host now
            assert p._solo is not None and len(p._solo.pending) == 1 and not p._solo.queue
            with stopped(pid):
                r = await asyncio.wait_for(queued, 5)  # (never watched: it would wait for ever)
                took = time.monotonic() - started
            assert r.kind == "timeout" and "after its deadline; the host process was killed" in r.error, r
            assert 1.25 <= took < scaled(HANG_GUARD_S), took  # deadline (1 s) + grace (0.3 s), not sooner
            assert (await p.acall("AID.ECHO.v1", 2)).output == 2
            assert pid not in p.pids()
    asyncio.run(main())


def test_a_batch_sent_unanswered_past_its_deadline_is_a_wedged_host(plugins: list[str], no_orphans: None) -> None:
    # A batch's calls sent together share one watch entry (the earliest deadline of them):
    # past it plus the grace period with any of them unanswered, the host is killed.
    async def main() -> None:
        async with pool(plugins, workers=4, grace=0.3) as p:
            await p.acall("AID.ECHO.v1", 0)
            [pid] = p.pids()
            calls = [md.Call("AID.TEST.SLOW.v1", {"ms": 300}, timeout=t) for t in (0.8, 0.6, 5.0)]
            started = time.monotonic()
            batch = p.acall_many(calls, check=False)
            await asyncio.sleep(0.1)
            with stopped(pid):
                got = await asyncio.wait_for(batch, 5)
                took = time.monotonic() - started
            assert [r.kind for r in got] == ["crash", "timeout", "crash"], got
            assert "after its deadline; the host process was killed" in got[1].error
            assert 0.85 <= took < scaled(HANG_GUARD_S), took  # the earliest deadline (0.6 s) + grace (0.3 s)
            assert (await p.acall("AID.ECHO.v1", 2)).output == 2
    asyncio.run(main())


def test_inprocess_acall_leaves_the_loop_free(plugins: list[str]) -> None:
    async def main() -> None:
        host = md.InProcess(plugins=plugins)
        ticks: list[float] = []
        ticker = asyncio.ensure_future(every(0.01, lambda: ticks.append(0)))
        started = time.monotonic()
        results = await asyncio.gather(*(host.acall("AID.TEST.SLOW.v1", {"ms": 100, "stamps": 1}) for _ in range(20)))
        elapsed = time.monotonic() - started
        ticker.cancel()
        assert all(r.ok for r in results)
        assert most_at_once(r.output for r in results) >= 2, results  # not one after another on the loop's thread
        assert len(ticks) >= elapsed / 0.01 * 0.5, (len(ticks), elapsed)  # the loop kept running meanwhile
    asyncio.run(main())
