"""The serve-pool transport (machina_dispatch.Pool): pipelining by id from many
threads, asyncio and batch calls, per-call deadlines, the bounded request window,
restarts after crashes, wedged hosts, large responses, and closing without orphans
(explicitly, at interpreter exit and on SIGTERM)."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import machina_dispatch as md
import pytest
from conftest import HANG_GUARD_S, PAST_GUARD_MS, TOOLHOST, base_env, scaled
from dispatch_support import orphans_since, stopped, toolhost_processes


@pytest.fixture
def plugins(misbehaving: str) -> list[str]:
    return [misbehaving, str(md.builtin_plugin_path())]


@pytest.fixture
def pool(plugins: list[str]) -> Iterator[md.Pool]:
    before = toolhost_processes()
    p = md.Pool(2, executable=TOOLHOST, plugins=plugins, env=base_env())
    yield p
    p.close()
    assert not orphans_since(before)


def test_many_threads_share_the_pool(pool: md.Pool) -> None:
    results: dict[int, list[int]] = {}

    def worker(k: int) -> None:
        results[k] = [pool.call("AID.ECHO.v1", {"k": k, "i": i}).output["i"] + 1000 * k for i in range(200)]

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {k: [1000 * k + i for i in range(200)] for k in range(8)}
    assert len(pool.pids()) <= 2


def test_batch_keeps_order_and_pipelines(pool: md.Pool) -> None:
    calls = [md.Call("AID.ECHO.v1", {"n": i}) for i in range(20_000)]
    results = pool.call_many(calls)
    assert [r.output["n"] for r in results] == list(range(20_000))
    mixed = pool.call_many(["AID.NOPE.v1", ("AID.ECHO.v1", [1]), md.Call("AID.TEST.FAIL.v1")], check=False)
    assert [r.code for r in mixed] == ["tool_not_found", None, "tool_error"]
    with pytest.raises(md.ToolNotFound):
        pool.call_many(["AID.NOPE.v1"], check=True)


def test_batch_and_single_calls_share_one_process(plugins: list[str]) -> None:
    # A batch reads for itself while other threads' calls are pending on the same process:
    # each answer reaches its own caller.
    with md.Pool(1, executable=TOOLHOST, plugins=plugins, env=base_env(), max_in_flight=64) as pool:
        singles: dict[int, list[int]] = {}

        def single(k: int) -> None:
            singles[k] = [pool.call("AID.ECHO.v1", {"i": i}).output["i"] + 1000 * k for i in range(300)]

        threads = [threading.Thread(target=single, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        batches = [pool.call_many([("AID.ECHO.v1", {"n": i}) for i in range(5_000)]) for _ in range(3)]
        for t in threads:
            t.join()
        assert singles == {k: [1000 * k + i for i in range(300)] for k in range(3)}
        assert all([r.output["n"] for r in b] == list(range(5_000)) for b in batches)
        assert len(pool.pids()) == 1


def test_long_requests_from_many_threads_do_not_interleave(plugins: list[str]) -> None:
    # A 100 KB line goes into the pipe in pieces (writes are atomic only up to 4 KiB):
    # another thread's line must not land between them.
    with md.Pool(1, executable=TOOLHOST, plugins=plugins, env=base_env()) as pool:
        bad: list[tuple[int, int, str | None]] = []

        def single(k: int) -> None:
            for i in range(10):
                text = str(k) * 100_000
                r = pool.call("AID.ECHO.v1", {"t": text, "i": i}, check=False)
                if not r.ok or r.output != {"t": text, "i": i}:
                    bad.append((k, i, r.code))

        threads = [threading.Thread(target=single, args=(k,)) for k in range(6)]
        for t in threads:
            t.start()
        batch = pool.call_many([("AID.ECHO.v1", {"b": "x" * 50_000, "n": n}) for n in range(40)])
        for t in threads:
            t.join()
        assert bad == []
        assert [r.output["n"] for r in batch] == list(range(40))


def test_asyncio_calls(pool: md.Pool) -> None:
    async def main() -> list[md.ToolResult]:
        gathered = await asyncio.gather(*(pool.acall("AID.ECHO.v1", {"i": i}) for i in range(500)))
        batch = await pool.acall_many([md.Call("AID.ECHO.v1", i) for i in range(100)])
        with pytest.raises(md.ToolNotFound):
            await pool.acall("AID.NOPE.v1")
        return [*gathered, *batch]

    results = asyncio.run(main())
    assert [r.output["i"] for r in results[:500]] == list(range(500))
    assert [r.output for r in results[500:]] == list(range(100))


def test_large_responses_need_no_line_limit(plugins: list[str]) -> None:
    """A 9 MiB answer through the asyncio path (asyncio streams would stop at 64 KiB
    lines) and the sync path."""
    size = 9 * 1024 * 1024
    with md.Pool(1, executable=TOOLHOST, plugins=plugins, args=["--max-output-bytes", str(10 * 1024 * 1024)],
                     env=base_env()) as p:
        assert isinstance(p, md.Pool)

        async def main() -> md.ToolResult:
            return await p.acall("AID.TEST.HUGE.v1", {"bytes": size})

        r = asyncio.run(main())
        assert len(r.output) == size
        assert len(p.call("AID.TEST.HUGE.v1", {"bytes": size}).output) == size


def test_deadline_is_answered_on_time(pool: md.Pool) -> None:
    started = time.monotonic()
    r = pool.call("AID.TEST.SLOW.v1", {"ms": PAST_GUARD_MS}, timeout=0.2, check=False)
    assert r.code == "timeout" and 0.2 <= time.monotonic() - started < scaled(HANG_GUARD_S)
    assert pool.call("AID.ECHO.v1", 7).output == 7


def test_wedged_host_is_killed_and_replaced(pool: md.Pool) -> None:
    pool.call("AID.ECHO.v1", 0)
    [pid] = pool.pids()
    with stopped(pid):
        started = time.monotonic()
        r = pool.call("AID.ECHO.v1", 1, timeout=0.2, check=False)
    assert r.kind == "timeout" and r.code is None
    assert "the host process was killed" in r.error
    assert 0.2 + pool.grace <= time.monotonic() - started < scaled(HANG_GUARD_S)  # its deadline, then the grace
    assert pool.call("AID.ECHO.v1", 2).output == 2
    assert pid not in pool.pids()


def test_crashed_process_is_restarted(pool: md.Pool) -> None:
    pool.call("AID.ECHO.v1", 0)
    first = set(pool.pids())
    r = pool.call("AID.TEST.ABORT.v1", check=False)
    assert r.kind == "crash" and "was killed by signal 6 (SIGABRT" in r.error
    assert pool.call("AID.ECHO.v1", 1).output == 1
    assert set(pool.pids()) - first  # a new process


def test_request_window_is_bounded(plugins: list[str]) -> None:
    """With max_in_flight=2, six concurrent slow calls never have more than two
    requests outstanding on the process; the others wait their turn."""
    with md.Pool(1, workers=4, max_in_flight=2, executable=TOOLHOST, plugins=plugins, env=base_env()) as p:
        assert isinstance(p, md.Pool)
        p.call("AID.ECHO.v1", 0)
        proc = p._sync[0]
        assert proc is not None
        peak = 0
        stop = threading.Event()

        def watch() -> None:
            nonlocal peak
            while not stop.is_set():
                peak = max(peak, len(proc.pending))
                time.sleep(0.001)

        watcher = threading.Thread(target=watch)
        watcher.start()
        threads = [threading.Thread(target=p.call, args=("AID.TEST.SLOW.v1", {"ms": 100})) for _ in range(6)]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        watcher.join()
        assert peak == 2
        assert time.monotonic() - started >= 0.29  # three rounds of two


def test_window_full_until_the_deadline_is_a_timeout(plugins: list[str]) -> None:
    with md.Pool(1, max_in_flight=1, executable=TOOLHOST, plugins=plugins, env=base_env()) as p:
        assert isinstance(p, md.Pool)
        blocker = threading.Thread(target=p.call, args=("AID.TEST.SLOW.v1", {"ms": 800}))
        blocker.start()
        time.sleep(0.2)
        r = p.call("AID.ECHO.v1", 1, timeout=0.2, check=False)
        blocker.join()
        assert r.kind == "timeout" and "no room in the host's request window" in r.error


def test_close_fails_nothing_that_was_answered_and_leaves_no_process(plugins: list[str]) -> None:
    before = toolhost_processes()
    p = md.Pool(2, executable=TOOLHOST, plugins=plugins, env=base_env())
    assert p.call("AID.ECHO.v1", 1).output == 1
    p.close()
    p.close()  # twice is fine
    with pytest.raises(RuntimeError, match="closed"):
        p.call("AID.ECHO.v1", 1)
    assert not orphans_since(before)


def _descriptors_and_threads() -> tuple[int, int]:
    """This process's open descriptors and its threads (C++ ones included)."""
    return len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task"))


def test_hosts_ended_leave_no_descriptor_and_no_thread(plugins: list[str]) -> None:
    # Each host process has three pipes and a thread of the core's draining its stderr;
    # a closed pool, a crashed host and a host killed as wedged give all of them back.
    before = toolhost_processes()
    with md.Pool(1, executable=TOOLHOST, plugins=plugins, env=base_env()) as warm:
        warm.call("AID.ECHO.v1", 0)
    del warm
    gc.collect()  # what earlier tests left for the collector goes first
    fds, threads = _descriptors_and_threads()
    for i in range(20):
        with md.Pool(2, executable=TOOLHOST, plugins=plugins, env=base_env(), grace=0.2) as p:
            assert p.call("AID.ECHO.v1", i).output == i
            assert p.call("AID.TEST.CRASH.v1", check=False).kind == "crash"
            async def one(pool: md.Pool, i: int) -> md.ToolResult:
                return await pool.acall("AID.ECHO.v1", i)

            assert asyncio.run(one(p, i)).output == i
    # Every pool has ended its processes (reaped) and joined their drainer threads; the
    # pipes close when the objects go (kept till then so that no number is reused early).
    del p
    gc.collect()
    now_fds, now_threads = _descriptors_and_threads()
    assert now_fds <= fds and now_threads <= threads, ((fds, threads), (now_fds, now_threads))  # none kept
    assert not orphans_since(before)


SCRIPT = textwrap.dedent("""
    import sys, time, machina_dispatch as md
    pool = md.Pool(2, executable=sys.argv[1], plugins=sys.argv[2:])
    pool.call("AID.ECHO.v1", 1)
    pool.call_many([("AID.ECHO.v1", 2), ("AID.ECHO.v1", 3)])
    print(" ".join(map(str, pool.pids())), flush=True)
    if sys.stdin.readline().strip() == "hang":
        time.sleep(60)
""")


def _start_script(plugins: list[str]) -> tuple[subprocess.Popen[str], list[int]]:
    child = subprocess.Popen([sys.executable, "-c", SCRIPT, TOOLHOST, *plugins], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=base_env())
    assert child.stdout is not None
    pids = [int(x) for x in child.stdout.readline().split()]
    assert len(pids) == 2
    return child, pids


def _gone(pids: list[int], wait_s: float = 5.0) -> bool:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if not any(pid in toolhost_processes() for pid in pids):
            return True
        time.sleep(0.05)
    return False


def test_interpreter_exit_closes_the_pool(plugins: list[str]) -> None:
    child, pids = _start_script(plugins)
    child.communicate("exit\n", timeout=30)
    assert child.returncode == 0
    assert _gone(pids)


def test_sigterm_closes_the_pool(plugins: list[str]) -> None:
    child, pids = _start_script(plugins)
    assert child.stdin is not None
    child.stdin.write("hang\n")
    child.stdin.flush()
    time.sleep(0.2)
    child.send_signal(signal.SIGTERM)
    child.wait(timeout=30)
    assert child.returncode == -signal.SIGTERM  # it still dies of SIGTERM
    assert _gone(pids)


def test_killed_interpreter_leaves_no_host(plugins: list[str]) -> None:
    """Even SIGKILL (no cleanup at all): the hosts see their input end and exit."""
    child, pids = _start_script(plugins)
    assert child.stdin is not None
    child.stdin.write("hang\n")
    child.stdin.flush()
    time.sleep(0.2)
    child.kill()
    child.wait(timeout=30)
    assert _gone(pids)


def test_state_is_private_to_each_call(pool: md.Pool) -> None:
    """A state written by one caller never shows up in another caller's call, even on
    the same host process, pipelined."""
    mine = md.DsState()
    pool.call("AID.STATE.PUT.v1", {"slot": 0, "type": "t", "content": "secret"}, state=mine)
    others = pool.call_many([md.Call("AID.STATE.GET.v1", {"slot": 0}) for _ in range(50)])
    assert all(r.output["present"] is False for r in others)
    assert pool.call("AID.STATE.GET.v1", {"slot": 0}, state=mine).output["content"] == "secret"


def test_requests_carry_the_deadline(plugins: list[str], tmp_path: object) -> None:
    """What the pool sends: ids, the caller's timeout as timeout_ms, an explicit empty
    state (checked by running a fake host that records its input)."""
    recorder = textwrap.dedent("""
        import json, sys
        for line in sys.stdin:
            req = json.loads(line)
            sys.stderr.write(line)
            print(json.dumps({"id": req["id"], "ok": True, "status": "OK", "output_json": json.dumps(req),
                              "error": "", "ds_state": {"delta": True, "slots": {}, "removed_slots": []}}),
                  flush=True)
    """)
    fake = os.path.join(str(tmp_path), "fake-host")
    with open(fake, "w") as f:
        f.write(f"#!{sys.executable}\n{recorder}")
    os.chmod(fake, 0o755)
    with md.Pool(1, executable=fake, env=base_env()) as p:
        sent = p.call("AID.X.v1", {"a": 1}, timeout=2.5, idempotency_key="k", lease_token="t").output
    assert sent == {"id": 1, "aid": "AID.X.v1", "input_json": '{"a":1}', "idempotency_key": "k",
                    "_lease_token": "t", "timeout_ms": 2500}  # no state: none sent (--state-per-call)
    assert json.loads(json.dumps(sent))  # plain JSON
