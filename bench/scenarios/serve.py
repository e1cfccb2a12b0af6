"""The --serve host itself: file-fed throughput, lock-step latency by CPU placement, --workers
scaling, and how payload size and registry size bear on a call."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from .._support import (
    ECHO_REQUEST,
    Latency,
    Spread,
    env_with,
    interleaved,
    ok_fraction,
    rate,
    ratio,
    repeat,
    run_lockstep,
    spread_rate,
    us,
)
from ._baselines import MCP_CALL, MCP_INIT, MCP_INITIALIZED, mcp_server, python_host
from ._context import Ctx, Section, Table, placements, startup_s, timed_host


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
