"""What the host's rules cost a call: the idempotency cache, the audit store and ds_state."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._support import ECHO_REQUEST, Spread, env_with, file_fed, interleaved, ok_fraction, ratio, repeat, spread_rate
from ._context import Ctx, Section, Table, timed_host


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
