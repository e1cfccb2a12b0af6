"""The Python clients: the serve pool (lock-step and pipelined) beside the MCP SDK client,
a host spawned per call (--run), and the in-process host."""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from .._support import Latency, env_with, rate, ratio, repeat, spread_rate, us
from ._context import Ctx, Section, Table


async def mcp_sdk_calls(n: int) -> tuple[float, Latency]:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "bench.baselines.mcp_echo_server"],
                                   env=env_with())
    async with stdio_client(params) as (reader, writer), ClientSession(reader, writer) as session:
        await session.initialize()
        for _ in range(20):
            await session.call_tool("echo", {"msg": "hello", "n": 1})
        samples = []
        start = time.perf_counter()
        for _ in range(n):
            t0 = time.perf_counter_ns()
            r = await session.call_tool("echo", {"msg": "hello", "n": 1})
            samples.append(float(time.perf_counter_ns() - t0))
            if r.is_error:
                raise RuntimeError(f"MCP echo failed: {r}")
        return n / (time.perf_counter() - start), Latency(samples)


def python_client(ctx: Ctx) -> Section:
    import machina_dispatch as md

    s = Section("python", "From Python: pooled dispatch, lock-step and pipelined",
                "What an agent written in Python sees. `Pool` keeps `machina-toolhost --serve` "
                "processes and pipelines requests over them (`call_many`); lock-step is one `call` at "
                "a time. Baselines in the same run: the official MCP Python SDK (its own client, "
                "`ClientSession.call_tool`, over its stdio server with one echo tool) and a new "
                "`machina-toolhost --run` process per call (`run_machina_toolhost`, the dispatch "
                "client).")
    n_lock = ctx.n(10_000, 100_000)
    n_pipe = ctx.n(20_000, 200_000)
    inp = {"msg": "hello", "n": 1}
    rows = []
    with md.Pool(1, executable=ctx.host) as pool:
        ctx.status("pool lock-step")
        for _ in range(2000):
            pool.call("AID.ECHO.v1", inp)
        samples = []
        start = time.perf_counter()
        for _ in range(n_lock):
            t0 = time.perf_counter_ns()
            pool.call("AID.ECHO.v1", inp)
            samples.append(float(time.perf_counter_ns() - t0))
        lock_rate = n_lock / (time.perf_counter() - start)
        lock = Latency(samples)
    ctx.status("MCP SDK client")
    mcp_rate, mcp_lat = asyncio.run(mcp_sdk_calls(ctx.n(200, 2000)))
    ctx.status("spawn per call")
    n_spawn = ctx.n(50, 300)
    md.run_machina_toolhost("AID.ECHO.v1", inp, executable=ctx.host)
    start = time.perf_counter()
    for _ in range(n_spawn):
        r = md.run_machina_toolhost("AID.ECHO.v1", inp, executable=ctx.host)
        assert isinstance(r, str), r  # the output string; a failure is a dict
    spawn_rate = n_spawn / (time.perf_counter() - start)
    rows.append(["Pool.call, lock-step", rate(lock_rate) + "/s", us(lock.p(50)), us(lock.p(99)), "1.00×"])
    rows.append(["MCP SDK ClientSession.call_tool, lock-step", rate(mcp_rate) + "/s", us(mcp_lat.p(50)),
                 us(mcp_lat.p(99)), ratio(lock_rate, mcp_rate)])
    rows.append(["run_machina_toolhost (a process per call)", rate(spawn_rate) + "/s", "–", "–",
                 ratio(lock_rate, spawn_rate)])
    s.tables.append(Table("Lock-step from Python (unpinned); last column: Pool lock-step calls/s ÷ this row's",
                          ["client", "calls/s", "p50 µs", "p99 µs", "Pool ÷ this"], rows))
    s.headline["pool_lockstep_p50_us"] = lock.p(50) / 1e3
    s.headline["mcp_sdk_ratio"] = lock_rate / mcp_rate

    pipe_rows = []
    procs = [1, 2] if ctx.quick else [1, 2, 4]
    medians = []
    forms = [("JSON text", json.dumps(inp)), ("dict (encoded by machina_dispatch, orjson)", inp)]
    for p in procs:
        with md.Pool(p, executable=ctx.host) as pool:
            for form, value in forms:
                ctx.status(f"pool pipelined, {p} processes, {form}")
                calls = [("AID.ECHO.v1", value)] * n_pipe
                pool.call_many(calls[:2000])

                def once(pool: md.Transport = pool, calls: list[tuple[str, Any]] = calls) -> float:
                    start = time.perf_counter()
                    results = pool.call_many(calls)
                    elapsed = time.perf_counter() - start
                    assert all(r.ok for r in results)
                    return n_pipe / elapsed

                sp = repeat(once, ctx.reps)
                if form == "JSON text":
                    medians.append(sp.median)
                pipe_rows.append([str(p), form, spread_rate(sp), ratio(sp.median, spawn_rate),
                                  ratio(sp.median, mcp_rate)])
    s.tables.append(Table(f"Pipelined from one Python thread: Pool.call_many of {n_pipe:,} echo calls, "
                          f"{ctx.reps} runs", ["host processes", "inputs given as", "calls/s (min–max)",
                                               "÷ process per call", "÷ MCP SDK lock-step"], pipe_rows))
    s.headline["pool_pipelined_cps"] = max(medians)
    ctx.lines_plot(s, "pool_pipelined.png", "Pool.call_many throughput", "host processes",
                   "thousand calls / s", {"JSON-text inputs": ([float(p) for p in procs], [m / 1e3 for m in medians])},
                   zero=True, xticks=[float(p) for p in procs])
    return s


def spawn(ctx: Ctx) -> Section:
    import machina_dispatch as md

    s = Section("spawn", "--run: a process per call",
                "subprocess.run from Python of /bin/true (the floor: starting any process), of "
                "`machina-toolhost --run AID.ECHO.v1` with a request on stdin, and "
                "`run_machina_toolhost` (which also encodes the request and decodes the response), "
                "interleaved so that drift in machine load hits every case alike.")
    n = ctx.n(60, 400)
    request = json.dumps({"input_json": json.dumps({"msg": "hello", "n": 1})}).encode()

    def sub(cmd: list[str], stdin: bytes) -> Callable[[], None]:
        def go() -> None:
            p = subprocess.run(cmd, input=stdin, capture_output=True)
            assert p.returncode == 0, p.stderr

        return go

    cases: dict[str, Callable[[], Any]] = {
        "/bin/true": sub(["/bin/true"], request),
        "machina-toolhost --run AID.ECHO.v1": sub([ctx.host, "--run", "AID.ECHO.v1"], request),
        "run_machina_toolhost (Python API)": lambda: md.run_machina_toolhost("AID.ECHO.v1", {"msg": "hello", "n": 1},
                                                                             executable=ctx.host),
    }
    samples: dict[str, list[float]] = {k: [] for k in cases}
    ctx.status("spawn")
    for fn in cases.values():
        fn()
    for _ in range(n):
        for name, fn in cases.items():
            t0 = time.perf_counter_ns()
            fn()
            samples[name].append(float(time.perf_counter_ns() - t0))
    base = statistics.median(samples["/bin/true"])
    rows = []
    for name, xs in samples.items():
        lat = Latency(xs)
        rows.append([name, f"{lat.p(50) / 1e6:.3f}", f"{lat.p(90) / 1e6:.3f}", ratio(lat.p(50), base)])
    s.tables.append(Table(f"{n} calls each, interleaved, unpinned", ["command", "p50 ms", "p90 ms", "÷ /bin/true"],
                          rows))
    s.headline["run_vs_true"] = statistics.median(samples["machina-toolhost --run AID.ECHO.v1"]) / base
    s.headline["spawn_api_vs_true"] = statistics.median(samples["run_machina_toolhost (Python API)"]) / base
    return s


def inprocess(ctx: Ctx) -> Section:
    import machina_dispatch as md
    from machina_dispatch import _core, _testing

    s = Section("inprocess", "In-process calls (pybind11 `_core`)",
                "Echo calls on the C++ host inside this Python process. `core only` is the host's own "
                "handling of one call measured in C++ (the tool's work plus the rules), the floor for "
                "the Python paths; `_core.call` is the raw binding; `InProcess.call` is the transport "
                "agents use (input encoding, result object). Overhead = per-call time − core only. "
                "With 2 threads each runs half the calls; the GIL is released while the tool runs.")
    n = ctx.n(100_000, 1_000_000)
    t = md.InProcess()
    host = t.host
    arg = '{"msg":"hello","n":1}'
    ctx.status("in-process core")
    core_ns = statistics.median(_testing.time_handle(str(md.builtin_plugin_path()), "AID.ECHO.v1", arg, n // 4) * 1e9
                                for _ in range(ctx.reps))

    def raw(count: int) -> None:
        sess = _core.Session(True)
        call = _core.call
        for _ in range(count):
            call(host, "AID.ECHO.v1", arg, sess, None, None, None, None)

    def transport(count: int) -> None:
        call = t.call
        for _ in range(count):
            call("AID.ECHO.v1", arg)

    def json_fn(count: int) -> None:  # a Python tool behind json: the reference a Python registry pays
        loads, dumps = json.loads, json.dumps

        def echo(x: Any) -> Any:
            return x

        for _ in range(count):
            dumps(echo(loads(arg)))

    rows = []
    for name, fn in [("_core.call", raw), ("InProcess.call", transport), ("Python function via json (reference)",
                                                                          json_fn)]:
        for threads in (1, 2):
            ctx.status(f"in-process {name}, {threads} threads")

            def once(fn: Callable[[int], None] = fn, threads: int = threads) -> float:
                per = n // threads
                ths = [threading.Thread(target=fn, args=(per,)) for _ in range(threads)]
                start = time.perf_counter()
                for th in ths:
                    th.start()
                for th in ths:
                    th.join()
                return per * threads / (time.perf_counter() - start)

            fn(1000)
            sp = repeat(once, ctx.reps)
            per_call = 1e9 / sp.median
            over = f"{(per_call - core_ns) / 1e3:.2f}" if "json" not in name else "–"
            rows.append([name, str(threads), f"{per_call / 1e3:.2f}", spread_rate(sp), over])
            if threads == 1 and name == "_core.call":
                s.headline["inprocess_raw_overhead_us"] = (per_call - core_ns) / 1e3
            if threads == 1 and name == "InProcess.call":
                s.headline["inprocess_overhead_us"] = (per_call - core_ns) / 1e3
                s.headline["inprocess_us"] = per_call / 1e3
    rows.insert(0, ["core only (C++ loop)", "1", f"{core_ns / 1e3:.2f}", rate(1e9 / core_ns) + "/s", "0"])
    t.close()
    s.tables.append(Table(f"{n:,} calls per run, {ctx.reps} runs", ["path", "threads", "µs/call",
                                                                    "calls/s (min–max)", "overhead µs"], rows))
    return s
