"""The benchmark scenarios. Each takes the run's context and returns a Section: tables of
figures measured side by side with their baselines in this run, plots, and the headline
figures the report's goal table reads."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._support import (
    ECHO_REQUEST,
    Latency,
    Native,
    Spread,
    env_with,
    file_fed,
    interleaved,
    ok_fraction,
    pipelined,
    python_cmd,
    rate,
    ratio,
    repeat,
    run_lockstep,
    spread_rate,
    us,
)


@dataclass
class Table:
    caption: str
    header: list[str]
    rows: list[list[str]]


@dataclass
class Section:
    key: str
    title: str
    explain: str
    tables: list[Table] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    headline: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class Ctx:
    quick: bool
    out: Path
    work: Path
    host: str
    native: Native
    status: Callable[[str], None]
    reps: int = 0

    def __post_init__(self) -> None:
        self.reps = 3 if self.quick else 5

    def n(self, quick: int, full: int) -> int:
        return quick if self.quick else full

    def lines(self, name: str, line: str, count: int) -> Path:
        path = self.work / f"{name}.ndjson"
        if not path.exists():
            with path.open("w") as f:
                for _ in range(count // 1000):
                    f.write((line + "\n") * 1000)
                f.write((line + "\n") * (count % 1000))
        return path

    def plot(self) -> Any:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        return plt

    def lines_plot(self, section: Section, name: str, title: str, xlabel: str, ylabel: str,
                   series: dict[str, tuple[list[float], list[float]]], *, logx: bool = False,
                   logy: bool = False, zero: bool = False, xticks: list[float] | None = None) -> None:
        """One line per series (label: (xs, ys)); a label starting with "ideal" is dashed."""
        fig, ax = self.plot().subplots(figsize=(5.5, 3.2))
        for label, (xs, ys) in series.items():
            ax.plot(xs, ys, marker="" if label.startswith("ideal") else "o",
                    linestyle="--" if label.startswith("ideal") else "-", label=label)
        if logx:
            ax.set_xscale("log", base=2 if xticks else 10)
        if logy:
            ax.set_yscale("log")
        if zero:
            ax.set_ylim(bottom=0)
        if xticks:
            ax.set_xticks(xticks, [f"{x:g}" for x in xticks])
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        if len(series) > 1:
            ax.legend(fontsize=8)
        self.save(fig, name, section)

    def save(self, fig: Any, name: str, section: Section) -> None:
        fig.tight_layout()
        fig.savefig(self.out / name, dpi=110)
        self.plot().close(fig)
        section.plots.append(name)


def timed_host(cmd: list[str], stdin: Path, ctx: Ctx, expect: int,
               env: dict[str, str] | None = None) -> Callable[[], float]:
    out = ctx.work / "out.ndjson"

    def run() -> float:
        return file_fed(cmd, stdin, out, expect, env=env).seconds

    return run


def startup_s(ctx: Ctx, cmd: list[str], env: dict[str, str] | None = None) -> float:
    """Median seconds from spawn to exit of `cmd` on empty input: taken off file-fed runs
    whose work is short enough for it to matter."""
    empty = ctx.work / "empty.ndjson"
    empty.touch()
    return repeat(timed_host(cmd, empty, ctx, 0, env=env), ctx.reps).median


def python_host(codec: str) -> list[str]:
    return python_cmd("bench.baselines.echo_host", codec)


def mcp_server() -> list[str]:
    return python_cmd("bench.baselines.mcp_echo_server")


MCP_INIT = ('R:{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
            '"capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}')
MCP_INITIALIZED = 'N:{"jsonrpc":"2.0","method":"notifications/initialized"}'
MCP_CALL = ('{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo",'
            '"arguments":{"msg":"hello","n":1}}}')


# --- 1. --serve file-fed ---------------------------------------------------------------


def serve_file(ctx: Ctx) -> Section:
    s = Section("serve", "--serve throughput, file-fed",
                "N echo requests in a file on stdin, responses to a file: requests per second for "
                "machina-toolhost and, on the same file in the same run, `cat` (the physical floor of "
                "moving the bytes through a process) and a plain Python NDJSON host speaking the same "
                "protocol (stdlib json and orjson). Ratio = machina-toolhost ÷ that row.")
    n = ctx.n(100_000, 200_000)
    echo = ctx.lines("serve-echo", ECHO_REQUEST, n)
    stats_req = json.dumps({"aid": "AID.TEXT.STATS.v1", "input_json": json.dumps({"text": "to be or not to be"})})
    stats = ctx.lines("serve-stats", stats_req, n)
    env = env_with()
    cases: list[tuple[str, list[str], Path]] = [
        ("machina-toolhost --serve (AID.ECHO.v1)", [ctx.host, "--serve"], echo),
        ("machina-toolhost --serve (AID.TEXT.STATS.v1)", [ctx.host, "--serve"], stats),
        ("cat (floor)", ["cat"], echo),
        ("Python host, json", python_host("json"), echo),
        ("Python host, orjson", python_host("orjson"), echo),
    ]
    ctx.status("serve, file-fed, interleaved")
    times = interleaved({name: timed_host(cmd, src, ctx, n, env=env) for name, cmd, src in cases}, ctx.reps)
    results = {name: Spread([n / t for t in ts]) for name, ts in times.items()}
    ours = results[cases[0][0]].median
    rows = [[name, spread_rate(sp), ratio(ours, sp.median)] for name, sp in results.items()]
    s.tables.append(Table(f"{n:,} requests per run, {ctx.reps} runs, unpinned", ["command", "requests/s (min–max)",
                                                                               "echo ÷ this"], rows))
    s.headline["serve_rps"] = ours
    s.headline["serve_vs_json"] = ours / results["Python host, json"].median
    plt = ctx.plot()
    fig, ax = plt.subplots(figsize=(7, 3.2))
    names = list(results)
    ax.barh(names, [results[k].median / 1e6 for k in names],
            xerr=[[(results[k].median - results[k].lo) / 1e6 for k in names],
                  [(results[k].hi - results[k].median) / 1e6 for k in names]], color="#4477aa")
    ax.invert_yaxis()
    ax.set_xlabel("million requests / s (median, min–max)")
    ax.set_title("--serve, file-fed")
    ctx.save(fig, "serve_throughput.png", s)
    return s


# --- 2. lock-step latency, native driver -----------------------------------------------


def placements(ctx: Ctx) -> list[tuple[str, int | None, int | None]]:
    cpus = sorted(os.sched_getaffinity(0))
    out: list[tuple[str, int | None, int | None]] = [(f"one vCPU (both on CPU {cpus[0]})", cpus[0], cpus[0])]
    if len(cpus) > 1:
        out.append((f"two vCPUs (driver CPU {cpus[0]}, host CPU {cpus[1]})", cpus[0], cpus[1]))
    return out


def lat_row(name: str, where: str, lat: Latency, base: float) -> list[str]:
    return [name, where, us(lat.p(50)), us(lat.p(90)), us(lat.p(99)), us(lat.p(99.9)), ratio(lat.p(50), base)]


LAT_HEADER = ["host", "placement", "p50 µs", "p90 µs", "p99 µs", "p99.9 µs", "p50 ÷ machina-toolhost"]


def lockstep(ctx: Ctx) -> Section:
    s = Section("lockstep", "Lock-step latency (native driver)",
                "A C driver (bench/native/lockstep.c) sends one request line, waits for its response "
                "line, and repeats; each round trip is timed with CLOCK_MONOTONIC. The driver and the "
                "host are pinned as the placement column says: on one vCPU every round trip is two "
                "context switches on the same core; across two vCPUs it pays two cross-CPU wake-ups. "
                "`cat` is the floor (a pipe round trip with no work); the MCP row is the official MCP "
                "Python SDK's stdio server answering raw JSON-RPC `tools/call` lines from the same "
                "driver. Last column: that host's p50 ÷ machina-toolhost's p50 in the same placement.")
    driver = ctx.native.lockstep()
    n = ctx.n(10_000, 100_000)
    n_mcp = ctx.n(500, 5_000)
    env = env_with()
    rows = []
    cdf: dict[str, Latency] = {}
    for where, dcpu, hcpu in placements(ctx):
        ctx.status(f"lock-step, {where}")
        ours = run_lockstep(driver, [ctx.host, "--serve"], n, 2000, ECHO_REQUEST, driver_cpu=dcpu, host_cpu=hcpu)
        base = ours.p(50)
        rows.append(lat_row("machina-toolhost --serve", where, ours, base))
        others = [
            ("cat (floor)", ["cat"], n, ECHO_REQUEST, (), ""),
            ("Python host, json", python_host("json"), n, ECHO_REQUEST, (), '"ok":true'),
            ("Python host, orjson", python_host("orjson"), n, ECHO_REQUEST, (), '"ok":true'),
            ("MCP Python SDK, stdio, raw JSON-RPC", mcp_server(), n_mcp, MCP_CALL, (MCP_INIT, MCP_INITIALIZED),
             '"isError":false'),
        ]
        measured = {"machina-toolhost --serve": ours}
        for name, cmd, count, request, pre, expect in others:
            ctx.status(f"lock-step {name}, {where}")
            measured[name] = run_lockstep(driver, cmd, count, min(500, count), request, pre=pre, expect=expect,
                                          driver_cpu=dcpu, host_cpu=hcpu, env=env)
            rows.append(lat_row(name, where, measured[name], base))
        if dcpu == hcpu:
            cdf = measured
            s.headline["lockstep_p50_one_cpu_us"] = base / 1e3
            s.headline["lockstep_cat_p50_one_cpu_us"] = measured["cat (floor)"].p(50) / 1e3
            s.headline["mcp_raw_ratio"] = measured["MCP Python SDK, stdio, raw JSON-RPC"].p(50) / base
        else:
            s.headline["lockstep_p50_two_cpu_us"] = base / 1e3
    s.tables.append(Table(f"{n:,} round trips per host ({n_mcp:,} for MCP), after a warm-up", LAT_HEADER, rows))
    plt = ctx.plot()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for name, lat in cdf.items():
        xs = lat.sorted_ns
        ax.plot([x / 1e3 for x in xs], [(i + 1) / len(xs) for i in range(len(xs))], label=name)
    ax.set_xscale("log")
    ax.set_xlabel("round trip, µs (log)")
    ax.set_ylabel("fraction of calls")
    ax.set_title("Lock-step latency CDF, one vCPU")
    ax.legend(fontsize=7)
    ctx.save(fig, "lockstep_cdf.png", s)
    return s


# --- 3. from Python: the pool, the MCP SDK client, spawn per call ----------------------


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
                "`machina-toolhost --run` process per call (`run_machina_toolhost`, the seed's "
                "dispatch function).")
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


# --- 4. --run spawn cost ----------------------------------------------------------------


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


# --- 5. in-process ----------------------------------------------------------------------


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


# --- 6. --workers scaling with a 1 ms tool ---------------------------------------------


def workers(ctx: Ctx) -> Section:
    s = Section("workers", "--workers scaling with a tool that sleeps 1 ms",
                "AID.BENCH.SLEEP.v1 (bench/native/bench_tools.c) sleeps 1 ms per call; requests carry "
                "ids, so answers may come out of order. The ideal is N × 1000 calls/s for N workers. "
                "The host's start-up and exit (the same command on empty input, median) is subtracted "
                "from each run's time.")
    plugin = ctx.native.bench_tools()
    counts = [1, 4, 16, 64] if ctx.quick else [1, 2, 4, 8, 16, 32, 64]
    per_worker = ctx.n(100, 300)
    rows = []
    xs: list[float] = []
    ys: list[float] = []
    for w in counts:
        ctx.status(f"--workers {w}")
        n = w * per_worker
        path = ctx.work / f"sleep-{w}.ndjson"
        path.write_text("".join(json.dumps({"id": i, "aid": "AID.BENCH.SLEEP.v1", "input_json": "{}"}) + "\n"
                                for i in range(n)))
        cmd = [ctx.host, "--serve", "--plugin", str(plugin), "--workers", str(w)]
        startup = startup_s(ctx, cmd)
        sp = repeat(timed_host(cmd, path, ctx, n), ctx.reps)
        rates = Spread([n / max(x - startup, 1e-6) for x in sp.values])
        rows.append([str(w), spread_rate(rates), rate(w * 1000) + "/s", f"{rates.median / (w * 1000):.0%}",
                     f"{startup * 1e3:.1f}"])
        xs.append(w)
        ys.append(rates.median)
    s.tables.append(Table(f"{per_worker} calls per worker per run, {ctx.reps} runs", ["workers", "calls/s (min–max)",
                                                                                   "ideal", "efficiency",
                                                                                   "start-up ms"], rows))
    s.headline["workers64_efficiency"] = ys[-1] / (xs[-1] * 1000)
    ctx.lines_plot(s, "workers_scaling.png", "1 ms tool", "--workers", "calls / s",
                   {"measured": (xs, ys), "ideal": (xs, [x * 1000 for x in xs])}, logx=True, logy=True,
                   xticks=xs)
    return s


# --- 7. idempotency ---------------------------------------------------------------------


def run_with_rss(ctx: Ctx, cmd: list[str], stdin: Path, out: Path, expect: int) -> tuple[float, int]:
    """Seconds and peak RSS (KiB) of `cmd < stdin > out` (measured by bench/native/maxrss.c)."""
    run = file_fed([str(ctx.native.maxrss()), *cmd], stdin, out, expect)
    if "maxrss_kib=" not in run.stderr:
        raise RuntimeError(f"{cmd}: no peak RSS reported: {run.stderr[-500:]}")
    return run.seconds, int(run.stderr.rsplit("maxrss_kib=", 1)[1].split()[0])


def idempotency(ctx: Ctx) -> Section:
    s = Section("idempotency", "Idempotency keys",
                "File-fed --serve of echo calls: without keys (the same request text, less the key); "
                "the unique-key text with the key's field renamed to one the host ignores (what the key's bytes "
                "cost to read, before any cache work); "
                "every call with the same key (after the first, each is a cache hit answered without "
                "running the tool); every call with its own "
                "key, with the default cache (1024 entries: each insert evicts the oldest) and with a "
                "cache large enough to keep them all. Ratio = throughput ÷ the run without keys.")
    n = ctx.n(200_000, 1_000_000)
    inp = json.dumps({"msg": "hello", "n": 1})
    # The baseline is the same request text without the key (so that the ratio is the key's
    # cost, not a difference in formatting).
    none = ctx.lines("idem-nokey", json.dumps({"aid": "AID.ECHO.v1", "input_json": inp}), n)
    same = ctx.lines("idem-same", json.dumps({"aid": "AID.ECHO.v1", "input_json": inp, "idempotency_key": "k"}), n)
    unique = ctx.work / "idem-unique.ndjson"
    if not unique.exists():
        with unique.open("w") as f:
            for i in range(n):
                f.write(json.dumps({"aid": "AID.ECHO.v1", "input_json": inp, "idempotency_key": f"key-{i}"}) + "\n")
    # What reading the key's bytes costs before any cache work: the unique-key text with the
    # field renamed to one the host ignores (a name of the same length), so no key at all.
    ignored = ctx.work / "idem-ignored.ndjson"
    if not ignored.exists():
        with ignored.open("w") as f:
            for i in range(n):
                f.write(json.dumps({"aid": "AID.ECHO.v1", "input_json": inp, "not_a_known_key": f"key-{i}"}) + "\n")
    out = ctx.work / "out.ndjson"
    cases = [
        ("no key", [ctx.host, "--serve"], none),
        ("no key, an ignored field of the key's size instead", [ctx.host, "--serve"], ignored),
        ("same key (cache hits)", [ctx.host, "--serve"], same),
        (f"{n:,} unique keys, default cache (1024)", [ctx.host, "--serve"], unique),
        (f"{n:,} unique keys, cache of {n:,}",
         [ctx.host, "--serve", "--idempotency-max-entries", str(n), "--idempotency-max-bytes", str(1 << 40)], unique),
    ]
    rows = []
    base = 0.0

    def case(name: str, cmd: list[str], src: Path) -> Callable[[], tuple[float, int]]:
        def run() -> tuple[float, int]:
            result = run_with_rss(ctx, cmd, src, out, n)
            if "hits" in name:
                hit_share = ok_fraction(out, b'"idempotent_hit":true')
                if hit_share < (n - 1) / n:
                    raise RuntimeError(f"only {hit_share:.1%} cache hits")
            return result

        return run

    ctx.status("idempotency, interleaved")
    measured = interleaved({name: case(name, cmd, src) for name, cmd, src in cases}, ctx.reps)
    for name, runs in measured.items():
        sp = Spread([n / t for t, _ in runs])
        if not base:
            base = sp.median
        rows.append([name, spread_rate(sp), ratio(sp.median, base), f"{max(r for _, r in runs) / 1024:.0f}"])
        if "default cache" in name:
            s.headline["unique_keys_ratio"] = sp.median / base
        if "hits" in name:
            s.headline["hit_ratio"] = sp.median / base
        if "ignored field" in name:
            s.headline["ignored_field_ratio"] = sp.median / base
    s.tables.append(Table(f"{n:,} requests per run, {ctx.reps} runs", ["requests", "requests/s (min–max)",
                                                                       "÷ no key", "peak RSS MiB"], rows))
    return s


def audit(ctx: Ctx) -> Section:
    s = Section("audit", "The audit store",
                "File-fed --serve of echo calls without the audit store (`--no-audit`) and with it (on by "
                "default, in $XDG_STATE_HOME/machina-toolhost/audit.db: one state folder per case, its "
                "database made before the first run and kept, as a host's store is): every call "
                "recorded, and the host ends only once every record is written (the time runs until then). "
                "Two inputs: the same on every call (its digest is remembered) and "
                "a different one on every call (each digested anew). Ratio = throughput ÷ the same input "
                "without the store.")
    n = ctx.n(200_000, 1_000_000)
    same = ctx.lines("idem-none", ECHO_REQUEST, n)
    varied = ctx.work / "audit-varied.ndjson"
    if not varied.exists():
        with varied.open("w") as f:
            for i in range(n):
                f.write(json.dumps({"aid": "AID.ECHO.v1", "input_json": json.dumps({"msg": "hello", "n": i})}) + "\n")
    out = ctx.work / "out.ndjson"
    counted: dict[str, int] = {}

    def case(name: str, src: Path, on: bool) -> Callable[[], float]:
        # The store as a user gets it: on by default, in the state folder (one per case).
        state = ctx.work / f"audit-state-{len(counted)}"
        env = env_with(XDG_STATE_HOME=str(state))
        db = state / "machina-toolhost" / "audit.db"
        if on:
            for suffix in ("", "-wal", "-shm"):
                Path(str(db) + suffix).unlink(missing_ok=True)
            subprocess.run([ctx.host, "--list"], capture_output=True, check=True, env=env)
            counted[name] = 0

        def run() -> float:
            cmd = [ctx.host, "--serve", *([] if on else ["--no-audit"])]
            seconds = file_fed(cmd, src, out, n, env=env).seconds
            if on:
                con = sqlite3.connect(db)
                # The number of the last call recorded (not a count of rows: past the store's
                # max_rows, with --reps of many runs, retention drops the oldest).
                last = "SELECT first_call + n - 1 FROM batches ORDER BY id DESC LIMIT 1"
                got = con.execute(f"SELECT coalesce(({last}), 0)").fetchone()[0]
                con.close()
                if got != counted[name] + n:
                    raise RuntimeError(f"{name}: {got - counted[name]} calls added to the store for {n} made")
                counted[name] = got
            return seconds

        return run

    cases = {"same input, no audit": case("same input, no audit", same, False),
             "same input, audit on": case("same input, audit on", same, True),
             "a new input each call, no audit": case("a new input each call, no audit", varied, False),
             "a new input each call, audit on": case("a new input each call, audit on", varied, True)}
    ctx.status("audit, interleaved")
    measured = interleaved(cases, ctx.reps)
    spreads = {name: Spread([n / t for t in runs]) for name, runs in measured.items()}
    base = spreads["same input, no audit"].median
    rows = [[name, spread_rate(sp), ratio(sp.median, base)] for name, sp in spreads.items()]
    s.headline["audit_ratio"] = spreads["same input, audit on"].median / base
    s.headline["audit_ratio_new_inputs"] = (spreads["a new input each call, audit on"].median /
                                            spreads["a new input each call, no audit"].median)
    s.tables.append(Table(f"{n:,} requests per run, {ctx.reps} runs", ["run", "requests/s (min–max)", "÷ no audit"],
                          rows))
    return s


# --- 8. payload sizes -------------------------------------------------------------------


def payload(ctx: Ctx) -> Section:
    s = Section("payload", "Payload sizes",
                "Echo of a JSON string of the given size (input_json and output_json each carry it, "
                "escaped inside the request and response lines); --max-output-bytes raised to 10 MiB "
                "so that 9 MB fits. MB/s counts request bytes in. `cat` moves the same file.")
    sizes = [100, 10_000, 100_000, 1_000_000, 9_000_000]
    volume = ctx.n(20_000_000, 200_000_000)
    rows = []
    series: dict[str, list[float]] = {"machina-toolhost": [], "cat": [], "Python host, orjson": []}
    env = env_with()
    for size in sizes:
        count = max(4, min(200_000, volume // size))
        line = json.dumps({"aid": "AID.ECHO.v1", "input_json": json.dumps("x" * size)})
        path = ctx.lines(f"payload-{size}", line, count)
        mb = path.stat().st_size / 1e6
        row = [f"{size:,} B", str(count)]

        def case(name: str, cmd: list[str], path: Path = path, count: int = count) -> Callable[[], float]:
            timed = timed_host(cmd, path, ctx, count, env=env)

            def run() -> float:
                t = timed()
                if name != "cat" and ok_fraction(ctx.work / "out.ndjson") != 1.0:
                    raise RuntimeError(f"{name} failed an echo of {path.name}")
                return t

            return run

        ctx.status(f"payload {size} B, interleaved")
        measured = interleaved({name: case(name, cmd) for name, cmd in [
            ("machina-toolhost", [ctx.host, "--serve", "--max-output-bytes", "10485760"]),
            ("cat", ["cat"]), ("Python host, orjson", python_host("orjson"))]}, ctx.reps)
        for name, ts in measured.items():
            mbs = Spread([mb / t for t in ts])
            series[name].append(mbs.median)
            row.append(f"{mbs.median:,.0f} ({mbs.lo:,.0f}–{mbs.hi:,.0f})")
        row.append(ratio(series["machina-toolhost"][-1], series["Python host, orjson"][-1]))
        rows.append(row)
    s.tables.append(Table(f"MB/s of requests in, median (min–max) of {ctx.reps} runs",
                          ["payload", "requests", "machina-toolhost", "cat", "Python host, orjson",
                           "ours ÷ orjson host"], rows))
    s.headline["payload_9mb_mbs"] = series["machina-toolhost"][-1]
    ctx.lines_plot(s, "payload.png", "Echo throughput by payload size", "payload bytes", "MB/s",
                   {name: ([float(x) for x in sizes], ys) for name, ys in series.items()}, logx=True, logy=True)
    return s


# --- 9. registry size ------------------------------------------------------------------


def tools(ctx: Ctx) -> Section:
    s = Section("tools", "Number of registered tools",
                "bench_tools.so registers MACHINA_BENCH_TOOLS echo tools. Start-up = `--serve` on "
                "empty input, from spawn to exit (loading and registering every tool); throughput = "
                "file-fed calls of one of them, with the start-up (median) taken off each run's time. "
                "Ratio = throughput ÷ the 1-tool run.")
    plugin = ctx.native.bench_tools()
    counts = [1, 10, 100, 1000, 10_000]
    n = ctx.n(50_000, 200_000)
    req = ctx.lines("tools", json.dumps({"aid": "AID.BENCH.T0.v1", "input_json": json.dumps({"msg": "hello"})}), n)
    rows = []
    base = 0.0
    ys = []
    for c in counts:
        ctx.status(f"{c} tools")
        env = env_with(MACHINA_BENCH_TOOLS=str(c))
        cmd = [ctx.host, "--serve", "--plugin", str(plugin)]
        startup = startup_s(ctx, cmd, env=env)
        sp = repeat(timed_host(cmd, req, ctx, n, env=env), ctx.reps)
        rates = Spread([n / max(t - startup, 1e-6) for t in sp.values])
        base = base or rates.median
        ys.append(rates.median)
        rows.append([f"{c:,}", f"{startup * 1e3:.1f}", spread_rate(rates), ratio(rates.median, base)])
    s.headline["tools_10k_ratio"] = ys[-1] / base
    s.tables.append(Table(f"{n:,} calls per run, {ctx.reps} runs", ["tools", "start-up ms", "calls/s (min–max)",
                                                                     "÷ 1 tool"], rows))
    ctx.lines_plot(s, "tools.png", "Throughput vs registry size", "registered tools", "thousand calls / s",
                   {"calls/s": ([float(c) for c in counts], [y / 1e3 for y in ys])}, logx=True, zero=True)
    return s


# --- 10. ds_state size -----------------------------------------------------------------


def ds_state(ctx: Ctx) -> Section:
    s = Section("ds_state", "ds_state size",
                "Each echo request carries a full ds_state with all 8 slots set, each artifact's "
                "content_json a string of the given size; the host checks and applies it and answers "
                "the (empty) delta. Ratio = throughput ÷ requests without ds_state.")
    sizes = [0, 64, 1024, 16_384, 131_072]
    volume = ctx.n(15_000_000, 150_000_000)
    rows = []
    base = 0.0
    xs: list[float] = []
    ys: list[float] = []
    for size in sizes:
        req: dict[str, Any] = {"aid": "AID.ECHO.v1", "input_json": "1"}
        if size:
            content = json.dumps("x" * size)
            req["ds_state"] = {"slots": {f"DS{i}": {"type": "text", "content_json": content} for i in range(8)}}
        line = json.dumps(req)
        count = max(20, min(ctx.n(100_000, 200_000), volume // len(line)))
        path = ctx.lines(f"ds-{size}", line, count)
        ctx.status(f"ds_state {size} B per slot")
        sp = repeat(timed_host([ctx.host, "--serve"], path, ctx, count), ctx.reps)
        if ok_fraction(ctx.work / "out.ndjson") != 1.0:
            raise RuntimeError(f"ds_state of {size} B per slot failed")
        rates = Spread([count / t for t in sp.values])
        base = base or rates.median
        mbs = rates.median * len(line) / 1e6
        rows.append([f"{size:,} B" if size else "none", f"{len(line):,}", spread_rate(rates), f"{mbs:,.0f}",
                     ratio(rates.median, base)])
        xs.append(len(line))
        ys.append(rates.median)
    s.tables.append(Table(f"{ctx.reps} runs", ["per slot", "request bytes", "requests/s (min–max)", "MB/s",
                                                "÷ no ds_state"], rows))
    ctx.lines_plot(s, "ds_state.png", "Cost of ds_state size", "request bytes (8 slots)", "requests / s",
                   {"requests/s": (xs, ys)}, logx=True, logy=True)
    return s


# --- 11. isolation ----------------------------------------------------------------------


def isolation(ctx: Ctx) -> Section:
    s = Section("isolation", "Process isolation vs inline",
                "The same echo calls with tools run inline (in the host's thread) and isolated "
                "(`--isolation process`, one worker: each call runs in a fresh process made ahead of time "
                "by the sandboxed worker; request and result cross that process's own pipes). Lock-step "
                "with the native driver, and file-fed throughput.")
    driver = ctx.native.lockstep()
    n = ctx.n(2_000, 20_000)
    rows = []
    for where, dcpu, hcpu in placements(ctx):
        ctx.status(f"isolation lock-step, {where}")
        inline = run_lockstep(driver, [ctx.host, "--serve"], n, 500, ECHO_REQUEST, driver_cpu=dcpu, host_cpu=hcpu)
        proc = run_lockstep(driver, [ctx.host, "--serve", "--isolation", "process"], n, 500, ECHO_REQUEST,
                            driver_cpu=dcpu, host_cpu=hcpu)
        # A worker inherits the host's CPU affinity: with the host pinned, so is the worker.
        rows.append(["inline", where, us(inline.p(50)), us(inline.p(99)), "–"])
        rows.append(["process", where, us(proc.p(50)), us(proc.p(99)), f"+{(proc.p(50) - inline.p(50)) / 1e3:.1f}"])
        key = "one" if dcpu == hcpu else "two"
        s.headline[f"isolation_added_{key}_cpu_us"] = (proc.p(50) - inline.p(50)) / 1e3
    s.tables.append(Table(f"Lock-step, {n:,} round trips each", ["tools run", "placement", "p50 µs", "p99 µs",
                                                                 "added p50 µs"], rows))
    m = ctx.n(5_000, 50_000)
    path = ctx.lines("serve-echo-iso", ECHO_REQUEST, m)
    trows = []
    base = 0.0
    ctx.status("isolation throughput, interleaved")
    measured = interleaved({name: timed_host(cmd, path, ctx, m) for name, cmd in [
        ("inline", [ctx.host, "--serve"]),
        ("process, 1 worker", [ctx.host, "--serve", "--isolation", "process"]),
        ("process, 2 workers", [ctx.host, "--serve", "--isolation", "process", "--workers", "2"])]}, ctx.reps)
    for name, ts in measured.items():
        rates = Spread([m / t for t in ts])
        base = base or rates.median
        trows.append([name, spread_rate(rates), ratio(rates.median, base)])
    s.tables.append(Table(f"File-fed, {m:,} echo requests, {ctx.reps} runs", ["tools run", "requests/s (min–max)",
                                                                              "÷ inline"], trows))
    return s


# --- 12. Python tools and HTTP tool services ---------------------------------------------

PY_ECHO_TOOL = 'def echo(payload):\n    return payload\n'
# The original system's runner, one interpreter per call, as its documents describe it.
FRESH_RUNNER = (
    "import importlib, io, json, sys, contextlib\n"
    "req = json.loads(sys.stdin.read())\n"
    "sys.path.insert(0, '.')\n"
    "mod, fn = req['entry'].split(':')\n"
    "f = getattr(importlib.import_module(mod), fn)\n"
    "with contextlib.redirect_stdout(io.StringIO()):\n"
    "    r = f(req.get('payload', {}))\n"
    "sys.stdout.write(json.dumps({'ok': True, 'protocol_version': 1, 'result': r}))\n")


def python_pack(ctx: Ctx) -> Path:
    """A pack with one trivial Python tool (it returns its payload)."""
    pack = ctx.work / "python-pack"
    (pack / "benchtools").mkdir(parents=True, exist_ok=True)
    (pack / "benchtools" / "__init__.py").write_text("")
    (pack / "benchtools" / "echo.py").write_text(PY_ECHO_TOOL)
    manifest = pack / "tools.toml"
    manifest.write_text(f'[[tool]]\naid = "AID.PY.ECHO.v1"\nrunner = "python"\nentry = "benchtools.echo:echo"\n'
                        f'python = "{sys.executable}"\n')
    return manifest


def python_tools(ctx: Ctx) -> Section:
    import machina_dispatch as md

    s = Section("python_tools", "Python tools and HTTP tool services",
                "A trivial Python tool (it returns its payload) declared in a tool manifest and run by the "
                "Python runner: warm worker interpreters of the package's tool worker, tool protocol v1 on "
                "their pipes. Baseline in the same run: the original system's way, a fresh interpreter per "
                "call (`python -c <runner>` with the request on stdin). Lock-step: the native driver "
                "(bench/native/lockstep.c) against `--serve`, one request at a time, unpinned. Pipelined: "
                "`Pool.call_many` from one Python thread, host `--workers 8`, two Python workers. Services: "
                "the same tool behind `machina-toolhost --http`, called through a service tool of a second "
                "host (keep-alive connection), against calling it directly.")
    manifest = python_pack(ctx)
    driver = ctx.native.lockstep()
    n = ctx.n(5_000, 50_000)
    request = json.dumps({"aid": "AID.PY.ECHO.v1", "input_json": json.dumps({"msg": "hello", "n": 1})})
    ctx.status("python tool lock-step")
    direct = run_lockstep(driver, [ctx.host, "--serve", "--tools", str(manifest)], n, 500, request)
    rows = [["Python tool via --serve (warm worker)", us(direct.p(50)), us(direct.p(99)), "1.00×"]]
    s.headline["python_lockstep_p50_us"] = direct.p(50) / 1e3

    # The original's fresh interpreter per call.
    ctx.status("fresh interpreter per call")
    call_json = json.dumps({"protocol_version": 1, "tool": "echo", "entry": "benchtools.echo:echo",
                            "payload": {"msg": "hello", "n": 1}}).encode()
    fresh = []
    for _ in range(ctx.n(20, 100)):
        t0 = time.perf_counter_ns()
        out = subprocess.run([sys.executable, "-c", FRESH_RUNNER], input=call_json, capture_output=True,
                             cwd=manifest.parent, check=True).stdout
        fresh.append(float(time.perf_counter_ns() - t0))
        assert json.loads(out)["ok"]
    fresh_lat = Latency(fresh)
    rows.append(["a fresh interpreter per call (the original's runner)", us(fresh_lat.p(50)), us(fresh_lat.p(99)),
                 ratio(fresh_lat.p(50), direct.p(50))])
    s.headline["python_fresh_ratio"] = fresh_lat.p(50) / direct.p(50)

    # The same tool behind --http, through a service tool.
    ctx.status("service round trip")
    http_host = subprocess.Popen([ctx.host, "--http", "127.0.0.1:0", "--tools", str(manifest)],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert http_host.stderr is not None
        port = http_host.stderr.readline().decode().rsplit(":", 1)[1].strip()
        svc = ctx.work / "service-pack" / "tools.toml"
        svc.parent.mkdir(exist_ok=True)
        svc.write_text(f'[[tool]]\naid = "AID.SVC.ECHO.v1"\nrunner = "service"\nurl = "http://127.0.0.1:{port}/run"\n'
                       f'name = "AID.PY.ECHO.v1"\n')
        via = run_lockstep(driver, [ctx.host, "--serve", "--tools", str(svc)], n, 500,
                           request.replace("AID.PY.ECHO.v1", "AID.SVC.ECHO.v1"))
        plugin_req = request.replace("AID.PY.ECHO.v1", "AID.ECHO.v1")
        svc.write_text(svc.read_text() + f'\n[[tool]]\naid = "AID.SVC.PLUGIN.v1"\nrunner = "service"\n'
                       f'url = "http://127.0.0.1:{port}/run"\nname = "AID.ECHO.v1"\n')
        plugin_direct = run_lockstep(driver, [ctx.host, "--serve"], n, 500, plugin_req)
        plugin_via = run_lockstep(driver, [ctx.host, "--serve", "--tools", str(svc)], n, 500,
                                  request.replace("AID.PY.ECHO.v1", "AID.SVC.PLUGIN.v1"))
    finally:
        http_host.terminate()
        http_host.wait(timeout=10)
    rows.append(["the same Python tool through a service tool (--serve → --http → worker)", us(via.p(50)),
                 us(via.p(99)), ratio(via.p(50), direct.p(50))])
    rows.append(["echo plugin, direct (--serve)", us(plugin_direct.p(50)), us(plugin_direct.p(99)),
                 ratio(plugin_direct.p(50), direct.p(50))])
    rows.append(["echo plugin through a service tool (--serve → --http)", us(plugin_via.p(50)), us(plugin_via.p(99)),
                 ratio(plugin_via.p(50), direct.p(50))])
    s.headline["service_added_us"] = (via.p(50) - direct.p(50)) / 1e3
    s.tables.append(Table(f"Lock-step round trips ({n:,} each; {len(fresh):,} fresh interpreters); "
                          "last column: this row's p50 ÷ the warm Python tool's",
                          ["how", "p50 µs", "p99 µs", "÷ warm Python tool"], rows))

    # Pipelined from Python.
    n_pipe = ctx.n(10_000, 40_000)
    prow = []
    for host_workers in (2, 8):
        with md.Pool(1, executable=ctx.host, tools=[str(manifest)], workers=host_workers,
                     args=["--python-workers", "2"]) as pool:
            calls = [("AID.PY.ECHO.v1", {"msg": "hello", "n": 1})] * n_pipe
            pool.call_many(calls[:2000])
            ctx.status(f"python tools pipelined, --workers {host_workers}")

            def once(pool: md.Transport = pool, calls: list[tuple[str, Any]] = calls) -> float:
                start = time.perf_counter()
                results = pool.call_many(calls)
                elapsed = time.perf_counter() - start
                assert all(r.ok for r in results)
                return n_pipe / elapsed

            sp = repeat(once, ctx.reps)
            prow.append([f"--workers {host_workers}, 2 Python workers", spread_rate(sp),
                         ratio(sp.median, 1e9 / fresh_lat.p(50))])
            s.headline["python_pipelined_cps"] = max(s.headline.get("python_pipelined_cps", 0.0), sp.median)
    s.tables.append(Table(f"Pipelined: Pool.call_many of {n_pipe:,} calls, {ctx.reps} runs",
                          ["host", "calls/s (min–max)", "÷ a fresh interpreter per call"], prow))
    return s


# --- JSON-RPC: the MCP front, hosted skills ----------------------------------------------

MCP_CALL_OURS = MCP_CALL.replace('"name":"echo"', '"name":"AID.ECHO.v1"')
SKILL_CALL = ('{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo",'
              '"arguments":{"msg":"hello","n":1}}}')


def mcp_calls_file(ctx: Ctx, name: str, tool: str, n: int, handshake: bool) -> Path:
    """An MCP session in a file: initialize (and initialized), then n calls with distinct ids."""
    path = ctx.work / f"{name}.jsonl"
    with path.open("w") as f:
        f.write(MCP_INIT[2:] + "\n")
        if handshake:
            f.write(MCP_INITIALIZED[2:] + "\n")
        for i in range(n):
            f.write(json.dumps({"jsonrpc": "2.0", "id": i + 10, "method": "tools/call",
                                "params": {"name": tool, "arguments": {"msg": "hello", "n": 1}}},
                               separators=(",", ":")) + "\n")
    return path


def jsonrpc(ctx: Ctx) -> Section:
    import machina_dispatch as md

    s = Section("jsonrpc", "JSON-RPC: the MCP front and hosted skills",
                "MCP: `machina-toolhost --mcp` serving the built-in echo tool against the official MCP Python "
                "SDK's stdio server with one echo tool (bench/baselines/mcp_echo_server.py), both driven by the "
                "same client: lock-step, the native driver (bench/native/lockstep.c) sending raw `tools/call` "
                "lines after the handshake; pipelined, a Python driver writing a file of calls with distinct "
                "ids while it reads the answers, until every call is answered (the time of the handshake "
                "alone taken off). Skills: a C skill that answers at once "
                "(bench/native/echo_skill.c) called directly by the native driver, against the same skill "
                "hosted by `--serve` (a `[[skill]]`); what the runner adds is the hosted round trip less the "
                "direct one less the host's own round trip for an inline echo. Concurrency: 16 calls at once "
                "to one Python skill process whose tool sleeps 10 ms (bench/baselines/sleep_skill.py), from "
                "16 threads through `machina_dispatch.Skill`.")
    driver = ctx.native.lockstep()
    env = env_with()
    n = ctx.n(5_000, 50_000)
    n_sdk = ctx.n(300, 2_000)
    pre = (MCP_INIT, MCP_INITIALIZED)
    rows = []
    for where, dcpu, hcpu in placements(ctx):
        ctx.status(f"MCP lock-step, {where}")
        ours = run_lockstep(driver, [ctx.host, "--mcp"], n, 1000, MCP_CALL_OURS, pre=pre, expect='"isError":false',
                            driver_cpu=dcpu, host_cpu=hcpu)
        inline = run_lockstep(driver, [ctx.host, "--mcp", "--workers", "1"], n, 1000, MCP_CALL_OURS, pre=pre,
                              expect='"isError":false', driver_cpu=dcpu, host_cpu=hcpu)
        sdk = run_lockstep(driver, mcp_server(), n_sdk, 100, MCP_CALL, pre=pre, expect='"isError":false',
                           driver_cpu=dcpu, host_cpu=hcpu, env=env)
        # The floor: a pipe round trip with no work (cat sends the line back; the line names
        # the marker the driver looks for).
        floor = run_lockstep(driver, ["cat"], n, 1000, MCP_CALL_OURS[:-1] + ',"isError":false}',
                             expect='"isError":false', driver_cpu=dcpu, host_cpu=hcpu)
        base = 1e9 / ours.mean
        for name, lat in (("machina-toolhost --mcp", ours), ("machina-toolhost --mcp --workers 1", inline),
                          ("MCP Python SDK, stdio", sdk), ("cat (floor: no work at all)", floor)):
            rows.append([name, where, us(lat.p(50)), us(lat.p(99)), rate(1e9 / lat.mean), ratio(base, 1e9 / lat.mean)])
        key = "one" if dcpu == hcpu else "two"
        s.headline[f"mcp_front_lockstep_ratio_{key}_cpu"] = sdk.mean / ours.mean
        s.notes.append(f"{where}: the most any server could reach here, a pipe round trip with no work (cat), is "
                       f"{sdk.mean / floor.mean:.0f}× the SDK's calls/s; --mcp reaches {sdk.mean / ours.mean:.0f}×.")
    # The same across two vCPUs with a driver that polls for each answer: on this VM a
    # sleeping driver's wake-up alone costs tens of microseconds whoever answers; polling
    # leaves each server's own time (and the pipe's). Neither is pinned, so a server that
    # polls for its next request (--mcp does, for --spin-us, when it may run on two vCPUs)
    # can.
    if len(placements(ctx)) > 1:
        where, dcpu, hcpu = "two vCPUs, not pinned, driver polling", None, None
        ctx.status(f"MCP lock-step, {where}")
        ours = run_lockstep(driver, [ctx.host, "--mcp"], n, 1000, MCP_CALL_OURS, pre=pre, expect='"isError":false',
                            driver_cpu=dcpu, host_cpu=hcpu, poll=True)
        sdk = run_lockstep(driver, mcp_server(), n_sdk, 100, MCP_CALL, pre=pre, expect='"isError":false',
                           driver_cpu=dcpu, host_cpu=hcpu, env=env, poll=True)
        floor = run_lockstep(driver, ["cat"], n, 1000, MCP_CALL_OURS[:-1] + ',"isError":false}',
                             expect='"isError":false', driver_cpu=dcpu, host_cpu=hcpu, poll=True)
        base = 1e9 / ours.mean
        for name, lat in (("machina-toolhost --mcp", ours), ("MCP Python SDK, stdio", sdk),
                          ("cat (floor: no work at all)", floor)):
            rows.append([name, where, us(lat.p(50)), us(lat.p(99)), rate(1e9 / lat.mean), ratio(base, 1e9 / lat.mean)])
        s.headline["mcp_front_lockstep_ratio_polling"] = sdk.mean / ours.mean
        s.notes.append(f"{where}: --mcp reaches {sdk.mean / ours.mean:.0f}× the SDK's calls/s (a pipe round trip "
                       f"with no work, cat: {sdk.mean / floor.mean:.0f}×).")
    s.tables.append(Table(f"Lock-step MCP tools/call round trips ({n:,} each, {n_sdk:,} for the SDK); last "
                          "column: machina-toolhost --mcp calls/s ÷ this row's",
                          ["server", "placement", "p50 µs", "p99 µs", "calls/s", "--mcp ÷ this"], rows))

    # Pipelined: a file of calls.
    n_pipe = ctx.n(50_000, 200_000)
    n_pipe_sdk = ctx.n(1_000, 5_000)
    ours_file = mcp_calls_file(ctx, "mcp-ours", "AID.ECHO.v1", n_pipe, True)
    sdk_file = mcp_calls_file(ctx, "mcp-sdk", "echo", n_pipe_sdk, True)
    ours_start = mcp_calls_file(ctx, "mcp-ours-0", "AID.ECHO.v1", 0, True)
    sdk_start = mcp_calls_file(ctx, "mcp-sdk-0", "echo", 0, True)
    ctx.status("MCP pipelined")
    ours_s = repeat(lambda: pipelined([ctx.host, "--mcp"], ours_file, n_pipe + 1, marker=b'"result"'), ctx.reps).median
    ours_0 = repeat(lambda: pipelined([ctx.host, "--mcp"], ours_start, 1), ctx.reps).median
    sdk_s = repeat(lambda: pipelined(mcp_server(), sdk_file, n_pipe_sdk + 1, env=env, marker=b'"result"'),
                   ctx.reps).median
    sdk_0 = repeat(lambda: pipelined(mcp_server(), sdk_start, 1, env=env), ctx.reps).median
    ours_rate = n_pipe / max(ours_s - ours_0, 1e-9)
    sdk_rate = n_pipe_sdk / max(sdk_s - sdk_0, 1e-9)
    s.headline["mcp_front_pipelined_ratio"] = ours_rate / sdk_rate
    s.tables.append(Table(f"Pipelined MCP tools/call, a file of {n_pipe:,} calls ({n_pipe_sdk:,} for the SDK), "
                          f"median of {ctx.reps}, start-up taken off",
                          ["server", "calls/s", "start-up s", "--mcp ÷ this"],
                          [["machina-toolhost --mcp", rate(ours_rate), f"{ours_0:.3f}", "1.00×"],
                           ["MCP Python SDK, stdio", rate(sdk_rate), f"{sdk_0:.3f}", ratio(ours_rate, sdk_rate)]]))

    # The skill runner's own cost.
    skill = ctx.work / "echo-skill"
    skill.mkdir(exist_ok=True)
    (skill / "manifest.json").write_text(json.dumps({"runtime": {"type": "subprocess",
                                                                 "command": str(ctx.native.echo_skill())}}))
    (skill / "SKILL.md").write_text("---\nname: echo\ndescription: answers its arguments\n---\n")
    hosted_request = json.dumps({"aid": "AID.SKILL.ECHO.ECHO.v1", "input_json": json.dumps({"msg": "hello", "n": 1})})
    srows = []
    # (All on one vCPU, every hop a switch on the same CPU, so that the subtraction is exact:
    # across two, the host and its skill share a CPU the driver does not.)
    for where, dcpu, hcpu in placements(ctx)[:1]:
        ctx.status(f"skill runner, {where}")
        direct = run_lockstep(driver, [str(ctx.native.echo_skill())], n, 1000, SKILL_CALL,
                              expect='"structuredContent"', driver_cpu=dcpu, host_cpu=hcpu)
        hosted = run_lockstep(driver, [ctx.host, "--serve", "--tools", str(skill)], n, 1000, hosted_request,
                              driver_cpu=dcpu, host_cpu=hcpu, env=env_with(XDG_STATE_HOME=str(ctx.work / "state")))
        host_only = run_lockstep(driver, [ctx.host, "--serve"], n, 1000, ECHO_REQUEST, driver_cpu=dcpu, host_cpu=hcpu)
        added = hosted.p(50) - host_only.p(50) - direct.p(50)
        srows.append([where, us(direct.p(50)), us(hosted.p(50)), us(host_only.p(50)), us(added)])
        s.headline["skill_runner_added_us"] = added / 1e3
    s.tables.append(Table(f"Lock-step p50 ({n:,} round trips each); the runner adds hosted − host alone − direct",
                          ["placement", "skill direct µs", "skill via --serve µs", "--serve inline echo µs",
                           "the runner adds µs"], srows))

    # Many calls in flight on one skill.
    ctx.status("16 concurrent calls to a sleeping skill")
    from concurrent.futures import ThreadPoolExecutor

    walls = []
    with md.Skill([sys.executable, "-m", "bench.baselines.sleep_skill"], cwd=Path(__file__).resolve().parent.parent,
                  name="sleeper") as t, ThreadPoolExecutor(16) as pool:
        t.call("sleep", {"ms": 1})
        for _ in range(ctx.n(10, 30)):
            t0 = time.perf_counter()
            results = list(pool.map(lambda _: t.call("sleep", {"ms": 10}), range(16)))
            walls.append(time.perf_counter() - t0)
            assert all(r.ok for r in results)
    wall = statistics.median(walls)
    s.headline["skill_16x10ms_ms"] = wall * 1e3
    s.tables.append(Table(f"16 calls at once to one skill whose tool sleeps 10 ms ({len(walls)} rounds)",
                          ["", "median ms", "min ms", "max ms", "if one at a time"],
                          [["all 16 answered", f"{wall * 1e3:.1f}", f"{min(walls) * 1e3:.1f}",
                            f"{max(walls) * 1e3:.1f}", "≥ 160"]]))
    return s


# --- 14. the tool packs ---------------------------------------------------------------------


GREP_MISS = "no_line_has_this_xq7v"  # a pattern nothing matches: every file is read


def packs(ctx: Ctx) -> Section:
    import machina_dispatch as md

    repo = Path(__file__).resolve().parent.parent
    s = Section("packs", "Tool packs: file read, code.grep and code.search",
                "File read: a 100-byte file read by `readFile` lock-step through `--serve` (the native "
                "driver) and through `InProcess` from Python, against Python reading it directly "
                "(`Path.read_text`). Grep: a pattern no line has, so every file is read, over this "
                "repository: `code.grep` through `--serve` (rg under the hood, sorted, .gitignore "
                "respected), `rg` run directly the same way, and plain `grep -rn` (which also reads "
                "what .gitignore excludes: the virtual environment and build folders), and `grep -rn` "
                "told to skip them. Search: `code.search` over this repository through `--serve`, the first "
                "search of a fresh index (every file read and indexed) and a warm one (nothing changed: "
                "every file checked, none read).")
    driver = ctx.native.lockstep()
    ws = ctx.work / "packs-ws"
    ws.mkdir(exist_ok=True)
    (ws / "small.txt").write_text("x" * 99 + "\n")
    n = ctx.n(5_000, 50_000)
    read_req = json.dumps({"aid": "readFile", "input_json": json.dumps({"path": "small.txt"})})
    ctx.status("file read")
    env = env_with(MACHINA_TOOLHOST_WORKSPACE=str(ws))
    served = run_lockstep(driver, [ctx.host, "--serve"], n, 1000, read_req, env=env)
    small = ws / "small.txt"
    t0 = time.perf_counter_ns()
    for _ in range(n):
        small.read_text()
    direct_ns = (time.perf_counter_ns() - t0) / n
    old = os.environ.get("MACHINA_TOOLHOST_WORKSPACE")
    os.environ["MACHINA_TOOLHOST_WORKSPACE"] = str(ws)
    try:
        with md.InProcess(packs=["files"]) as host:
            host.call("readFile", {"path": "small.txt"})
            t0 = time.perf_counter_ns()
            for _ in range(n):
                host.call("readFile", {"path": "small.txt"})
            inproc_ns = (time.perf_counter_ns() - t0) / n
    finally:
        if old is None:
            del os.environ["MACHINA_TOOLHOST_WORKSPACE"]
        else:
            os.environ["MACHINA_TOOLHOST_WORKSPACE"] = old
    s.headline["pack_read_serve_p50_us"] = served.p(50) / 1e3
    s.headline["pack_read_inprocess_us"] = inproc_ns / 1e3
    s.tables.append(Table(f"Reading a 100-byte file, {n:,} times each",
                          ["how", "µs per read", "÷ direct"],
                          [["readFile via --serve (lock-step p50)", us(served.p(50)), ratio(served.p(50), direct_ns)],
                           ["readFile via InProcess", f"{inproc_ns / 1e3:.2f}", ratio(inproc_ns, direct_ns)],
                           ["Path.read_text() in Python", f"{direct_ns / 1e3:.2f}", "1.00×"]]))

    ctx.status("grep over the repository")
    rg = shutil.which("rg") or str(Path(sys.executable).parent / "rg")
    reps = ctx.n(3, 10)

    def timed(cmd: list[str], **kw: Any) -> float:
        def once() -> float:
            t = time.perf_counter()
            subprocess.run(cmd, capture_output=True, timeout=600, **kw)
            return time.perf_counter() - t
        return statistics.median(once() for _ in range(reps))

    grep_req = json.dumps({"aid": "grepCode", "input_json": json.dumps({"pattern": GREP_MISS})})
    via = run_lockstep(driver, [ctx.host, "--serve"], reps, 1, grep_req,
                       env=env_with(MACHINA_TOOLHOST_WORKSPACE=str(repo)))
    rg_s = timed([rg, "--json", "--no-config", "--sort", "path", GREP_MISS, str(repo)])
    grep_s = timed(["grep", "-rn", GREP_MISS, str(repo)])
    grep_x = timed(["grep", "-rn", "--exclude-dir=.venv", "--exclude-dir=build", "--exclude-dir=.git", GREP_MISS,
                    str(repo)])
    via_s = via.p(50) / 1e9
    s.headline["grep_vs_grep_rn_ratio"] = grep_s / via_s
    s.tables.append(Table(f"One search of this repository (median of {reps})",
                          ["how", "ms", "grep -rn ÷ this"],
                          [["code.grep via --serve", f"{via_s * 1e3:.1f}", ratio(grep_s, via_s)],
                           ["rg directly (the same flags)", f"{rg_s * 1e3:.1f}", ratio(grep_s, rg_s)],
                           ["grep -rn", f"{grep_s * 1e3:.1f}", "1.00×"],
                           ["grep -rn, skipping .venv, build, .git", f"{grep_x * 1e3:.1f}", ratio(grep_s, grep_x)]]))

    # code.search: the first search builds its index (a fresh index folder each time), a warm
    # one finds every file unchanged.
    ctx.status("code.search over the repository")
    search_req = json.dumps({"aid": "AID.CODE.SEARCH.v1",
                             "input_json": json.dumps({"query": "idempotency cache eviction"})})
    search_env = env_with(MACHINA_TOOLHOST_WORKSPACE=str(repo))
    firsts = []
    policy = ctx.work / "code-index.toml"
    for i in range(reps):
        policy.write_text(f'[code]\nindex_dir = "{ctx.work / f"code-index-{i}"}"\n')
        firsts.append(run_lockstep(driver, [ctx.host, "--serve", "--policy", str(policy)], 1, 0, search_req,
                                   env=search_env).p(50))
    warm = run_lockstep(driver, [ctx.host, "--serve", "--policy", str(policy)], ctx.n(20, 100), 1, search_req,
                        env=search_env)
    done = subprocess.run([ctx.host, "--serve", "--policy", str(policy)], input=(search_req + "\n").encode(),
                          capture_output=True, env=search_env, timeout=600, check=True)
    index = json.loads(json.loads(done.stdout)["output_json"])["index"]
    first_s, warm_s = statistics.median(firsts) / 1e9, warm.p(50) / 1e9
    s.headline["code_search_first_ms"] = first_s * 1e3
    s.headline["code_search_warm_ms"] = warm_s * 1e3
    s.tables.append(Table(f"code.search over this repository ({index['files']:,} files indexed, "
                          f"{sum(p.stat().st_size for p in (ctx.work / 'code-index-0').glob('*.sqlite')) / 1e6:.1f} MB "
                          "of index)",
                          ["how", "ms", "files"],
                          [[f"first search: the index built (median of {reps})", f"{first_s * 1e3:.1f}",
                            f"{index['files']:,} indexed"],
                           [f"warm search: nothing changed (p50 of {len(warm.ns):,})", f"{warm_s * 1e3:.1f}",
                            f"{index['unchanged']:,} checked, {index['bytes_read']} bytes read"],
                           ["code.grep via --serve, for scale", f"{via_s * 1e3:.1f}", "every one read"]]))
    return s


def python_exec(ctx: Ctx) -> Section:
    s = Section("python_exec", "execute_python: sandboxed interpreters against python -c",
                "The same small piece of code (`sum(range(100))`) run by `execute_python` lock-step through "
                "`--serve` (the native driver): without a session (an interpreter of its own and a new folder "
                "each call: the workspace's interpreters, started ahead, each run one call and are then "
                "retired) and in one session (its reserved, warm interpreter); against "
                "starting the interpreter the workspace's environment is made from for each call "
                "(`python3 -c '...'`, no sandbox at all). Every execute_python call runs in the full walls "
                "(namespaces, seccomp, Landlock, limits) and answers the seed's fields.")
    code = "sum(range(100))"
    work = ctx.work / "python-exec"
    (work / "ws").mkdir(parents=True, exist_ok=True)
    policy = work / "policy.toml"
    policy.write_text(f"[python]\nworkspaces = {json.dumps(str(work / 'workspaces'))}\n"
                      f"python = {json.dumps(sys.executable)}\n")
    driver = ctx.native.lockstep()
    # A call without a session waits for an interpreter to start when it follows another at once.
    counts = {"stateless": ctx.n(200, 1_000), "session": ctx.n(2_000, 20_000)}
    env = env_with(MACHINA_TOOLHOST_WORKSPACE=str(work / "ws"))
    expect = '\\"success\\":true'
    results = {}
    for label, inputs in (("stateless", {"code": code}), ("session", {"code": code, "session_id": "bench"})):
        ctx.status(f"execute_python, {label}")
        request = json.dumps({"aid": "execute_python", "input_json": json.dumps(inputs)})
        results[label] = run_lockstep(driver, [ctx.host, "--serve", "--policy", str(policy)], counts[label],
                                      min(200, counts[label] // 10), request, expect=expect, env=env)
    ctx.status("python -c per call")
    base = getattr(sys, "_base_executable", sys.executable)
    fresh = []
    for _ in range(ctx.n(20, 100)):
        t0 = time.perf_counter_ns()
        out = subprocess.run([base, "-c", f"print({code})"], capture_output=True, check=True).stdout
        fresh.append(float(time.perf_counter_ns() - t0))
        assert out.strip() == b"4950"
    fresh_lat = Latency(fresh)
    stateless, session = results["stateless"], results["session"]
    s.headline["python_exec_p50_us"] = stateless.p(50) / 1e3
    s.headline["python_exec_session_p50_us"] = session.p(50) / 1e3
    s.headline["python_exec_fresh_ratio"] = fresh_lat.p(50) / stateless.p(50)
    s.tables.append(Table(f"Lock-step round trips ({counts['stateless']:,} execute_python calls without a session, "
                          f"{counts['session']:,} in one; {len(fresh):,} interpreters "
                          "started); last column: python -c's p50 ÷ this row's",
                          ["how", "p50 µs", "p99 µs", "python -c ÷ this"],
                          [["execute_python via --serve, no session", us(stateless.p(50)), us(stateless.p(99)),
                            ratio(fresh_lat.p(50), stateless.p(50))],
                           ["execute_python via --serve, one session", us(session.p(50)), us(session.p(99)),
                            ratio(fresh_lat.p(50), session.p(50))],
                           [f"{Path(base).name} -c per call (no sandbox)", us(fresh_lat.p(50)), us(fresh_lat.p(99)),
                            "1.00×"]]))
    s.notes.append("A call without a session also makes and removes its own folder; a session's call does not.")
    return s


def nats_scaleout(ctx: Ctx) -> Section:
    """Calls through NATS (machina-toolhost --nats hosts in one queue group) against the pool of
    --serve processes, side by side."""
    import machina_dispatch as md

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from nats_support import Front, nats_server

    s = Section("nats", "NATS: 1, 2 and 3 hosts in a queue group against the direct pool",
                "Echo calls from one Python process: throughput with `acall_many` of N calls, and lock-step "
                "latency (one `call` at a time, p50) — through a local nats-server to `machina-toolhost --nats` "
                "hosts sharing a queue group, and through `Pool` (the same number of `--serve` processes over "
                "pipes, no broker). What the broker costs per call is the lock-step difference.")
    n = ctx.n(4_000, 40_000)
    lock_n = ctx.n(500, 5_000)
    calls = [("AID.ECHO.v1", {"i": i}) for i in range(n)]

    def measure(t: md.Transport) -> tuple[float, float]:
        asyncio.run(t.acall_many(calls[:200]))  # warm
        t0 = time.perf_counter()
        asyncio.run(t.acall_many(calls))
        rate = n / (time.perf_counter() - t0)
        lat = []
        for i in range(lock_n):
            t1 = time.perf_counter_ns()
            t.call("AID.ECHO.v1", {"i": i})
            lat.append(time.perf_counter_ns() - t1)
        return rate, statistics.median(lat)

    rows = []
    with nats_server(jetstream=False) as url:
        for hosts in (1, 2, 3):
            ctx.status(f"nats, {hosts} host(s)")
            fronts = [Front(url, ["--packs", "none"]) for _ in range(hosts)]
            try:
                with md.Nats(url) as t:
                    nats_rate, nats_p50 = measure(t)
            finally:
                for f in fronts:
                    f.stop()
            ctx.status(f"pool of {hosts}")
            with md.Pool(hosts, executable=ctx.host) as pool:
                pool_rate, pool_p50 = measure(pool)
            s.headline[f"nats_{hosts}_calls_per_s"] = nats_rate
            s.headline[f"nats_{hosts}_p50_us"] = nats_p50 / 1e3
            s.headline[f"pool_{hosts}_calls_per_s"] = pool_rate
            rows.append([str(hosts), f"{nats_rate:,.0f}", f"{pool_rate:,.0f}", ratio(nats_rate, pool_rate),
                         us(nats_p50), us(pool_p50), us(nats_p50 - pool_p50)])
    s.headline["nats_broker_cost_us"] = float(rows[0][6])
    s.tables.append(Table(f"Echo, {n:,} calls with acall_many and {lock_n:,} lock-step calls",
                          ["hosts", "NATS calls/s", "pool calls/s", "NATS ÷ pool", "NATS p50 µs", "pool p50 µs",
                           "broker cost µs"], rows))
    s.notes.append("On this 2-vCPU machine the broker, the client and every host share two cores, so more hosts "
                   "add contention rather than capacity; across machines each host brings its own cores.")
    return s


from .nats_scenarios import nats_native  # noqa: E402  (it builds on the classes above)

SCENARIOS: dict[str, Callable[[Ctx], Section]] = {
    "serve": serve_file,
    "lockstep": lockstep,
    "python": python_client,
    "spawn": spawn,
    "inprocess": inprocess,
    "workers": workers,
    "idempotency": idempotency,
    "audit": audit,
    "payload": payload,
    "tools": tools,
    "ds_state": ds_state,
    "isolation": isolation,
    "python_tools": python_tools,
    "jsonrpc": jsonrpc,
    "packs": packs,
    "python_exec": python_exec,
    "nats": nats_scaleout,
    "nats_native": nats_native,
}

