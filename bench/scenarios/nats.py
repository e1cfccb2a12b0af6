"""NATS: calls through machina-toolhost --nats hosts in one queue group beside the direct pool
(``nats``); and the native front measured beside nats-server alone (``nats_native``): a null
responder (the least any responder can do: the broker's and the C client's ceiling on this
machine), then 1, 2 and 3 hosts in one queue group, driven by the native pipelined requester
(bench/native/nats_requester.c) and in lock-step; the Python client's `Nats.acall_many`; and
what the shared idempotency store costs a keyed call."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .._support import ECHO_REQUEST, HERE, Spread, rate, ratio, us
from ._context import Ctx, Section, Table

WINDOW = 1024  # requests in flight from the pipelined requester
KEYED_SUBJECT = "machina.tool.AID.ECHO.v1"
KEYED_BODY = '{"msg":"hello","n":1}'
KEYED_OK = '"error":null'  # (a tool subject answers {data, error})


def compile_driver(ctx: Ctx, name: str) -> Path:
    """bench/native/NAME.c linked with the NATS C client (libnats), once per results folder."""
    src = HERE / "native" / f"{name}.c"
    out = ctx.native.build / name
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        subprocess.run([ctx.native.cc, "-O2", "-Wall", "-Wextra", "-o", str(out), str(src), "-lnats", "-lpthread"],
                       check=True)
    return out


def toolhost_supports(ctx: Ctx, flag: str) -> bool:
    out = subprocess.run([ctx.host, "--help"], capture_output=True, text=True, timeout=60).stdout
    return flag in out


def request(requester: Path, url: str, *args: str) -> dict[str, Any]:
    proc = subprocess.run([str(requester), *args, url], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"nats_requester {' '.join(args)} failed ({proc.returncode}): {proc.stderr[-500:]}")
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def cpu_seconds(pid: int) -> float:
    """CPU time (user and system) a process and its threads have used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def server_pid(url: str) -> int:
    """The pid of the nats-server listening on `url`'s port (one of this run's)."""
    port = url.rsplit(":", 1)[1]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"nats-server") and b"-p" in argv and port.encode() in argv:
            return int(entry.name)
    raise RuntimeError(f"no nats-server process for {url}")


@contextmanager
def null_responder(binary: Path, url: str, subject: str, buffered: bool) -> Iterator[subprocess.Popen[bytes]]:
    """`buffered`: replies written by the C client's flusher (many at a time, each after up to a
    millisecond), else each at once."""
    proc = subprocess.Popen([str(binary), "-q", "q", *(["-B"] if buffered else []), url, subject],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"nats_null_responder did not start: {proc.stderr.read() if proc.stderr else ''!r}")
        yield proc
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def hosts(url: str, count: int, args: list[str]) -> Iterator[list[Any]]:
    from nats_support import Front

    fronts = []
    try:
        for _ in range(count):
            fronts.append(Front(url, ["--packs", "none", *args]))
        yield fronts
    finally:
        for f in fronts:
            f.stop()


def acall_many_rate(t: Any, calls: list[tuple[str, dict[str, int]]]) -> float:
    t0 = time.perf_counter()
    asyncio.run(t.acall_many(calls))
    return len(calls) / (time.perf_counter() - t0)


def nats_native(ctx: Ctx) -> Section:
    import machina_dispatch as md

    sys.path.insert(0, str(HERE.parent / "tests"))
    from nats_support import nats_server

    s = Section("nats_native", "NATS: the native front (--nats) beside nats-server alone",
                f"Echo calls through a local nats-server (JetStream on), every process on this machine's "
                f"{len(os.sched_getaffinity(0))} vCPUs. *Pipelined*: the native requester "
                f"(bench/native/nats_requester.c, libnats) keeps {WINDOW} requests in flight on `machina.call` and "
                "matches each reply to its request; *lock-step*: one request at a time. The null responder "
                "(bench/native/nats_null_responder.c) answers every request with a fixed reply (written by the C "
                "client's flusher when pipelined, at once in lock-step): what the broker and the C client allow, "
                "the ceiling for any responder. Hosts are `machina-toolhost --nats URL "
                "--packs none` in one queue group. The Python client is `md.Nats(url).acall_many` on one host.")
    n = ctx.n(20_000, 200_000)
    lock_n = ctx.n(1_000, 5_000)
    keyed_n = ctx.n(5_000, 20_000)
    reps = ctx.reps
    requester = compile_driver(ctx, "nats_requester")
    responder = compile_driver(ctx, "nats_null_responder")
    pipelined_args = ["-n", str(n), "-w", str(WINDOW), "-s", "machina.call", "-b", ECHO_REQUEST]
    lockstep_args = ["-l", "-n", str(lock_n), "-s", "machina.call", "-b", ECHO_REQUEST]

    def measure(label: str, url: str, responders: list[int], keyed: bool = False) -> tuple[Spread, dict[str, Any]]:
        """Pipelined runs and one lock-step run (its figures, and the CPU per pipelined call of the
        broker, the requester and the `responders` under "cpu_us"); `keyed`: every request with a key
        never used before (in the Idempotency-Key header, on the tool's own subject, which reads call
        options there)."""
        ctx.status(f"nats_native: {label}")

        def key() -> list[str]:
            return (["-k", f"bench-{secrets.token_hex(6)}", "-s", KEYED_SUBJECT, "-b", KEYED_BODY, "-e", KEYED_OK]
                    if keyed else [])

        request(requester, url, "-n", str(min(n, 20_000)), "-w", str(WINDOW), "-s", "machina.call",
                "-b", ECHO_REQUEST, *key())  # warm
        sizes = ["-n", str(keyed_n)] if keyed else []  # (a store's round trips make keyed calls slower)
        broker = server_pid(url)
        before = (cpu_seconds(broker), children_cpu_seconds(), sum(cpu_seconds(p) for p in responders))
        runs = [request(requester, url, *pipelined_args, *key(), *sizes)["calls_per_s"] for _ in range(reps)]
        after = (cpu_seconds(broker), children_cpu_seconds(), sum(cpu_seconds(p) for p in responders))
        calls = reps * (keyed_n if keyed else n)
        lock = request(requester, url, *lockstep_args, *key(), *(["-n", str(lock_n // 2)] if keyed else []))
        lock["cpu_us"] = [(a - b) / calls * 1e6 for a, b in zip(after, before, strict=True)]
        return Spread(runs), lock

    rows: list[list[str]] = []
    figures: dict[str, tuple[Spread, dict[str, Any]]] = {}
    python_rate = float("nan")
    with nats_server(jetstream=True) as url:
        # The null responder at its best for each: replies written many at a time when pipelined,
        # each at once in lock-step.
        with null_responder(responder, url, "machina.call", buffered=True) as proc:
            pipelined_null = measure("null responder, buffered", url, [proc.pid])
        with null_responder(responder, url, "machina.call", buffered=False) as proc:
            lockstep_null = measure("null responder", url, [proc.pid])[1]
        figures["null"] = (pipelined_null[0], {**lockstep_null, "cpu_us": pipelined_null[1]["cpu_us"]})
        for count in (1, 2, 3):
            with hosts(url, count, []) as fronts:
                figures[f"hosts{count}"] = measure(f"{count} host(s)", url, [f.proc.pid for f in fronts])
                if count == 1:
                    ctx.status("nats_native: Python client")
                    calls = [("AID.ECHO.v1", {"i": i}) for i in range(ctx.n(5_000, 50_000))]
                    with md.Nats(url) as t:
                        asyncio.run(t.acall_many(calls[:500]))  # warm
                        python_rate = Spread([acall_many_rate(t, calls) for _ in range(reps)]).median

        # Keyed calls: every request a key of its own, kept in the host's own cache, or with
        # --nats-idempotency kv in the group's JetStream key-value bucket.
        keyed: dict[str, tuple[Spread, dict[str, Any]]] = {}
        if toolhost_supports(ctx, "--nats-idempotency"):
            key_file = ctx.work / "nats-kv.key"
            key_file.write_text(secrets.token_hex(32) + "\n")
            key_file.chmod(0o600)
            for store, args in (("local", []), ("kv", ["--nats-idempotency", "kv", "--kv-key-file", str(key_file)])):
                with hosts(url, 1, args) as fronts:
                    keyed[store] = measure(f"keyed calls, {store} store", url, [f.proc.pid for f in fronts], keyed=True)

    def row(name: str, key: str, base: str = "null") -> list[str]:
        spread, lock = figures[key]
        return [name, f"{rate(spread.median)}/s ({rate(spread.lo)}–{rate(spread.hi)})",
                ratio(spread.median, figures[base][0].median), f"{lock['p50_us']:.0f}", f"{lock['p99_us']:.0f}",
                " · ".join(f"{x:.1f}" for x in lock["cpu_us"])]

    rows = [row("nats-server alone (null responder)", "null"), row("native front, 1 host", "hosts1"),
            row("native front, 2 hosts", "hosts2"), row("native front, 3 hosts", "hosts3")]
    s.tables.append(Table(f"Echo on machina.call: pipelined ({n:,} calls, {WINDOW} in flight, {reps} runs) and "
                          f"lock-step ({lock_n:,} calls)",
                          ["responder", "pipelined calls/s", "÷ nats-server alone", "lock-step p50 µs",
                           "lock-step p99 µs", "CPU µs per pipelined call: broker · requester · responder(s)"],
                          rows))
    s.tables.append(Table(f"The Python client, one host: `Nats.acall_many` of {ctx.n(5_000, 50_000):,} echo calls",
                          ["client", "calls/s", "÷ native requester"],
                          [["md.Nats(url).acall_many", f"{rate(python_rate)}/s",
                            ratio(python_rate, figures["hosts1"][0].median)]]))
    for key in ("null", "hosts1", "hosts2", "hosts3"):
        spread, lock = figures[key]
        s.headline[f"nats_native_{key}_calls_per_s"] = spread.median
        s.headline[f"nats_native_{key}_p50_us"] = lock["p50_us"]
    s.headline["nats_native_calls_per_s"] = figures["hosts1"][0].median
    s.headline["nats_native_lockstep_p50_us"] = figures["hosts1"][1]["p50_us"]
    s.headline["nats_python_acall_many_calls_per_s"] = python_rate
    if keyed:
        local, kv = keyed["local"], keyed["kv"]
        cost_us = kv[1]["p50_us"] - local[1]["p50_us"]
        s.headline["nats_kv_store_cost_us"] = cost_us
        s.tables.append(Table("Keyed calls (each its own Idempotency-Key), one host: the host's own cache against the "
                              "shared store (--nats-idempotency kv, a JetStream key-value bucket)",
                              ["store", f"pipelined calls/s ({keyed_n:,} calls)", "÷ own cache", "lock-step p50 µs",
                           "lock-step p99 µs"],
                              [[name, f"{rate(sp.median)}/s ({rate(sp.lo)}–{rate(sp.hi)})",
                                ratio(sp.median, local[0].median), f"{lk['p50_us']:.0f}", f"{lk['p99_us']:.0f}"]
                               for name, (sp, lk) in (("own cache", local), ("shared store (kv)", kv))]))
        s.notes.append(f"The shared store costs a keyed call about {cost_us:.0f} µs in lock-step (p50 difference): "
                       "what the host does with the bucket for each key (JetStream round trips) beside its own cache.")
    else:
        s.notes.append("This build has no --nats-idempotency: the shared store's cost is not measured.")
    broker_us, requester_us, host_us = figures["hosts1"][1]["cpu_us"]
    s.notes.append(f"Every process here (nats-server, the requester, the hosts) shares the same "
                   f"{len(os.sched_getaffinity(0))} vCPUs: a pipelined echo call takes about {broker_us:.1f} µs of CPU "
                   f"in the broker, {requester_us:.1f} µs in the requester and {host_us:.1f} µs in one host, so the "
                   "machine's cores, not a host, bound the rate, and a second and third host add contention rather "
                   "than capacity. With a host's calls on cores of their own (other machines, or more vCPUs), each "
                   "host adds its own rate up to what the broker's cores carry.")
    return s


def nats_scaleout(ctx: Ctx) -> Section:
    """Calls through NATS (machina-toolhost --nats hosts in one queue group) against the pool of
    --serve processes, side by side."""
    import machina_dispatch as md

    sys.path.insert(0, str(HERE.parent / "tests"))
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
