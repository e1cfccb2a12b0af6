"""Races of the serve pool's sync and asyncio readers, each once a real bug: a batch that
held the read lock while it had nothing to read, callers asleep on the read lock while
their answers came in, a request written into a new host through a reused descriptor, and
asyncio calls left pending by close()."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
import threading
import time
from typing import Any

import machina_dispatch as md
import machina_dispatch._pool_host_threaded as threaded_module
import pytest
from conftest import HANG_GUARD_S, PAST_GUARD_MS, TOOLHOST, base_env, scaled
from machina_dispatch import _core


@pytest.fixture
def plugins(misbehaving: str) -> list[str]:
    return [misbehaving, str(md.builtin_plugin_path())]


def make_pool(plugins: list[str], **options: Any) -> md.Pool:
    return md.Pool(1, executable=TOOLHOST, plugins=plugins, env=base_env(), **options)


def test_a_batch_waits_for_room_without_holding_the_reader(plugins: list[str]) -> None:
    # Eight threads keep a 4-call window full. A batch with none of its calls open must not
    # hold the read lock without reading: then nobody reads, and the host is killed as wedged.
    with make_pool(plugins, max_in_flight=4, timeout=3.0, grace=1.0) as pool:
        stop = threading.Event()
        failed: list[str] = []
        done = [0]

        def single() -> None:
            while not stop.is_set():
                r = pool.call("AID.ECHO.v1", {"x": 1}, check=False)
                done[0] += 1
                if not r.ok:
                    failed.append(r.error)

        threads = [threading.Thread(target=single) for _ in range(8)]
        for t in threads:
            t.start()
        try:
            for _ in range(3):  # (a host killed as wedged fails the batch, which raises, and the singles)
                results = pool.call_many([("AID.ECHO.v1", {"i": i}) for i in range(200)])
                assert [r.output["i"] for r in results] == list(range(200))
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert failed == [] and done[0] > 0


def test_a_batch_is_not_held_up_by_another_callers_long_call(plugins: list[str]) -> None:
    # A long call's thread reads for everyone while it waits; a batch started meanwhile
    # must get its answers when they come, not sleep on the read lock until the long call's
    # answer frees it (or its own deadline, killing the host as wedged).
    with make_pool(plugins, workers=4, grace=0.5) as pool:
        long: dict[str, Any] = {}

        def long_call() -> None:
            long["r"] = pool.call("AID.TEST.SLOW.v1", {"ms": 2000, "stamps": 1}, timeout=10, check=False)

        t = threading.Thread(target=long_call)
        t.start()
        time.sleep(0.3)
        batch = pool.call_many([md.Call("AID.TEST.SLOW.v1", {"ms": 10}, timeout=10) for _ in range(5)])
        batch_done_ns = time.monotonic_ns()
        t.join()
        assert all(r.ok for r in batch), batch
        assert long["r"].ok, long["r"]
        assert batch_done_ns < long["r"].output["ended_ns"], "the batch waited for the long call"


def test_a_caller_handed_the_reading_sees_its_answer_read_by_another(plugins: list[str]) -> None:
    # L reads, then hands the reading to F; a batch takes the lock first and reads F's
    # answer. F must return then, not when the batch's own 2 s call is done.
    with make_pool(plugins, workers=4, grace=1.0) as pool:
        pool.call("AID.TEST.SLOW.v1", {"ms": 1})
        returned_ns: dict[str, int] = {}
        batch_ended_ns: list[int] = []

        def one(name: str, ms: int, delay: float) -> None:
            time.sleep(delay)
            assert pool.call("AID.TEST.SLOW.v1", {"ms": ms}, timeout=10).ok
            returned_ns[name] = time.monotonic_ns()

        def batch(delay: float) -> None:
            time.sleep(delay)
            [r] = pool.call_many([md.Call("AID.TEST.SLOW.v1", {"ms": 2000, "stamps": 1}, timeout=10)])
            batch_ended_ns.append(r.output["ended_ns"])

        threads = [threading.Thread(target=one, args=("L", 300, 0.0)),
                   threading.Thread(target=one, args=("F", 600, 0.05)),
                   threading.Thread(target=batch, args=(0.1,))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # Both returned while the batch's call still ran (it sleeps 2 s; theirs 0.3 and 0.6 s).
        assert max(returned_ns["L"], returned_ns["F"]) < batch_ended_ns[0], (returned_ns, batch_ended_ns)


def test_a_request_never_reaches_the_replacement_host(plugins: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # A batch is between registering its call and writing it when its host dies and a new
    # one starts. Were the dead host's descriptors closed, their numbers would go to the new
    # host's pipes and the batch's request (numbered for the old host) be written there:
    # another caller would get its answer, and the next one kill the healthy host.
    real = _core

    class SlowEncode:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def encode_requests(self, batch: Any) -> bytes:
            time.sleep(0.3)  # widens the window between registering and writing
            encoded: bytes = real.encode_requests(batch)
            return encoded

    monkeypatch.setattr(threaded_module, "_core", SlowEncode())
    with make_pool(plugins, workers=2, timeout=3, grace=0.5) as pool:
        out: dict[str, Any] = {}

        def batch() -> None:
            out["batch"] = pool.call_many([("AID.TEST.SLOW.v1", {"ms": 1, "from": "batch"})], check=False)

        tb = threading.Thread(target=batch)
        tb.start()
        time.sleep(0.1)
        [old] = pool.pids()
        os.kill(old, signal.SIGKILL)
        time.sleep(0.05)
        assert pool.call("AID.ECHO.v1", 1, check=False).kind == "crash"  # notices the death

        def c() -> None:
            out["C"] = pool.call("AID.TEST.SLOW.v1", {"ms": 1000, "from": "C"}, check=False)

        tc = threading.Thread(target=c)
        tc.start()
        tb.join()
        tc.join()
        assert out["batch"][0].kind == "crash"
        assert out["C"].ok and out["C"].output["slept_ms"] == 1000, out["C"]
        time.sleep(0.5)
        assert pool.call("AID.ECHO.v1", 2).output == 2
        assert pool.pids() != [old]


def test_close_from_another_thread_fails_pending_asyncio_calls(plugins: list[str]) -> None:
    # close() from a thread (an application's shutdown path, or atexit) while an acall is
    # pending and the loop is busy: the call fails with crash soon after, not at its deadline.
    pool = make_pool(plugins)

    async def main() -> tuple[md.ToolResult, float]:
        started = time.monotonic()
        threading.Timer(0.3, pool.close).start()

        async def busy() -> None:
            await asyncio.sleep(0.25)
            time.sleep(0.5)  # the loop runs no callback meanwhile

        task = asyncio.get_running_loop().create_task(busy())
        r = await pool.acall("AID.TEST.SLOW.v1", {"ms": PAST_GUARD_MS}, timeout=PAST_GUARD_MS / 1000 + 5, check=False)
        await task
        return r, time.monotonic() - started

    r, took = asyncio.run(main())
    assert r.kind == "crash" and r.error.startswith("the pool was closed"), r
    assert 0.3 <= took < scaled(HANG_GUARD_S)  # close() came at 0.3 s


def test_a_lone_callers_answer_after_its_process_was_failed(plugins: list[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # The compiled round trip has read this caller's answer; before the caller hands it
    # out, another thread fails the process (a waiter's wedged(), close()). The caller
    # gets the failure it was given, raises nothing, and leaves the reader free.
    real = _core

    class FailedMeanwhile:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def round_trip(self, *args: Any) -> Any:
            answer = real.round_trip(*args)
            proc = pool._sync[0]
            assert proc is not None
            t = threading.Thread(target=proc.wedged, args=(None, "another call overran"))
            t.start()
            t.join()
            return answer

    with make_pool(plugins) as pool:
        monkeypatch.setattr(threaded_module, "_core", FailedMeanwhile())
        r = pool.call("AID.ECHO.v1", 1, check=False)
        assert r.kind == "crash" and "another call overran" in r.error
        proc = pool._sync[0]
        assert proc is not None and not proc.read_lock.locked()
        monkeypatch.setattr(threaded_module, "_core", real)
        assert pool.call("AID.ECHO.v1", 2).output == 2  # a new process


@pytest.mark.parametrize("transport", ["pool", "spawn"])
def test_an_error_code_this_build_does_not_know(transport: str, tmp_path: Any) -> None:
    # A host of another version answers with a code this module has no kind for: the call
    # fails as a response it cannot read (parse_error), raises nothing, and the next works.
    host = tmp_path / "newer-host"
    host.write_text(f"#!{sys.executable}\n" + textwrap.dedent("""
        import json, sys
        for line in sys.stdin:
            req = json.loads(line) if line.strip() else {}
            if req.get("input_json") == '"new"':
                out = {"ok": False, "status": "TOOL_ERROR", "output_json": "", "error": "x", "code": "brand_new_code"}
            else:
                out = {"ok": True, "status": "OK", "output_json": "1", "error": "", "ds_state": {}}
            if "id" in req:
                out["id"] = req["id"]
            sys.stdout.write(json.dumps(out) + "\\n")
            sys.stdout.flush()
    """))
    host.chmod(0o755)
    t: md.Transport = (md.Pool(executable=str(host), timeout=5, grace=0.5) if transport == "pool"
                       else md.Spawn(str(host), timeout=5))
    with t:
        r = t.call("AID.ECHO.v1", '"new"', check=False)  # (a str is JSON text already)
        assert r.kind == "parse_error" and "unknown error code 'brand_new_code'" in r.error, r
        assert t.call("AID.ECHO.v1", 1).output == 1
