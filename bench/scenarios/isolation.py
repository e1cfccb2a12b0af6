"""What running each call in an isolated worker process costs, by CPU placement."""

from __future__ import annotations

from .._support import ECHO_REQUEST, Spread, interleaved, ratio, run_lockstep, spread_rate, us
from ._context import Ctx, Section, Table, placements, timed_host


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
        if name == "process, 2 workers":
            s.headline["isolation_two_workers_cps"] = rates.median
    s.tables.append(Table(f"File-fed, {m:,} echo requests, {ctx.reps} runs", ["tools run", "requests/s (min–max)",
                                                                              "÷ inline"], trows))
    return s
