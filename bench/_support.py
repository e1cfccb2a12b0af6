"""Shared pieces of the benchmarks: statistics, timed runs, CPU placement, and the native
helpers (the lock-step driver and the bench tool plugin), compiled on first use."""

from __future__ import annotations

import io
import math
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

T = TypeVar("T")

HERE = Path(__file__).resolve().parent
ECHO_REQUEST = '{"aid":"AID.ECHO.v1","input_json":"{\\"msg\\":\\"hello\\",\\"n\\":1}"}'


def toolhost() -> str:
    """The machina-toolhost the Python package would run (see machina_dispatch.find_executable)."""
    from machina_dispatch import find_executable

    found = find_executable()
    if not found:
        raise SystemExit("machina-toolhost is not installed: pip install '.[bench]' first")
    return found


# --- statistics ------------------------------------------------------------------------


def percentile(sorted_xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (q in 0..100)."""
    if not sorted_xs:
        return math.nan
    k = max(0, min(len(sorted_xs) - 1, math.ceil(q / 100 * len(sorted_xs)) - 1))
    return sorted_xs[k]


@dataclass
class Spread:
    """Median and range of repeated measurements of one figure."""

    values: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def lo(self) -> float:
        return min(self.values)

    @property
    def hi(self) -> float:
        return max(self.values)


@dataclass
class Latency:
    """Latency samples in nanoseconds."""

    ns: list[float]
    sorted_ns: list[float] = field(init=False)

    def __post_init__(self) -> None:
        self.sorted_ns = sorted(self.ns)

    def p(self, q: float) -> float:
        return percentile(self.sorted_ns, q)

    @property
    def mean(self) -> float:
        return sum(self.ns) / len(self.ns)


def repeat(fn: Callable[[], float], times: int) -> Spread:
    return Spread([fn() for _ in range(times)])


def interleaved(cases: dict[str, Callable[[], T]], times: int) -> dict[str, list[T]]:
    """Runs every case once as a warm-up (discarded), then `times` rounds of all cases in
    turn, so that drift in the machine's load hits every case alike."""
    for fn in cases.values():
        fn()
    out: dict[str, list[T]] = {name: [] for name in cases}
    for _ in range(times):
        for name, fn in cases.items():
            out[name].append(fn())
    return out


# --- formatting ------------------------------------------------------------------------


def rate(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.2f} M"
    if x >= 1e3:
        return f"{x / 1e3:.1f} k"
    return f"{x:.0f}"


def spread_rate(s: Spread) -> str:
    return f"{rate(s.median)}/s ({rate(s.lo)}–{rate(s.hi)})"


def us(ns: float) -> str:
    return f"{ns / 1e3:.1f}" if ns < 1e5 else f"{ns / 1e3:.0f}"


def ratio(x: float, base: float) -> str:
    if base <= 0 or math.isnan(base) or math.isnan(x):
        return "–"
    r = x / base
    return f"{r:.2f}×" if r < 100 else f"{r:.0f}×"


# --- timed runs ------------------------------------------------------------------------


@dataclass
class Run:
    seconds: float
    stderr: str


def file_fed(cmd: list[str], stdin: Path, out: Path, expect_lines: int, env: dict[str, str] | None = None) -> Run:
    """Runs `cmd < stdin > out`, checking that it answered every line."""
    with stdin.open("rb") as fin, out.open("wb") as fout:
        start = time.perf_counter()
        proc = subprocess.run(cmd, stdin=fin, stdout=fout, stderr=subprocess.PIPE, env=env)
        elapsed = time.perf_counter() - start
    stderr = proc.stderr.decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} exited {proc.returncode}: {stderr[-500:]}")
    lines = count_lines(out)
    if lines != expect_lines:
        raise RuntimeError(f"{' '.join(cmd)}: {lines} response lines for {expect_lines} requests")
    return Run(elapsed, stderr)


def pipelined(cmd: list[str], stdin: Path, expect_lines: int, env: dict[str, str] | None = None,
              marker: bytes = b"") -> float:
    """Seconds from the first byte written to the last of `expect_lines` response lines read,
    with the input kept open meanwhile (a host may stop at the end of its input before it has
    answered what it read). Every line must hold `marker`."""
    data = stdin.read_bytes()
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    got = bytearray()
    lines = 0

    def write() -> None:
        assert proc.stdin is not None
        try:
            proc.stdin.write(data)
            proc.stdin.flush()
        except BrokenPipeError:
            pass

    writer = threading.Thread(target=write, daemon=True)
    start = time.perf_counter()
    writer.start()
    while lines < expect_lines:
        chunk = cast(io.BufferedReader, proc.stdout).read1(1 << 20)  # Popen's default: a buffered pipe
        if not chunk:
            break
        got += chunk
        lines += chunk.count(b"\n")
    elapsed = time.perf_counter() - start
    writer.join()
    proc.stdin.close()
    proc.stdout.read()
    stderr = proc.stderr.read() if proc.stderr is not None else b""
    proc.wait()
    if lines != expect_lines:
        raise RuntimeError(f"{' '.join(cmd)}: {lines} response lines for {expect_lines} requests: {stderr[-500:]!r}")
    if marker and got.count(marker) < expect_lines - 1:
        raise RuntimeError(f"{' '.join(cmd)}: answers without {marker!r}")
    return elapsed


def count_lines(path: Path) -> int:
    n = 0
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            n += chunk.count(b"\n")
    return n


def ok_fraction(path: Path, marker: bytes = b'"ok":true') -> float:
    total = good = 0
    with path.open("rb") as f:
        for line in f:
            total += 1
            good += marker in line
    return good / total if total else 0.0


# --- native helpers --------------------------------------------------------------------


class Native:
    """Compiles bench/native/*.c once per results folder with the system C compiler."""

    def __init__(self, build: Path) -> None:
        self.build = build
        build.mkdir(parents=True, exist_ok=True)
        self.cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or "cc"

    def _compile(self, name: str, out: Path, extra: list[str]) -> Path:
        src = HERE / "native" / f"{name}.c"
        if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
            subprocess.run([self.cc, "-O2", "-Wall", "-Wextra", *extra, "-o", str(out), str(src)], check=True)
        return out

    def lockstep(self) -> Path:
        return self._compile("lockstep", self.build / "lockstep", [])

    def echo_skill(self) -> Path:
        return self._compile("echo_skill", self.build / "echo_skill", [])

    def maxrss(self) -> Path:
        return self._compile("maxrss", self.build / "maxrss", [])

    def bench_tools(self) -> Path:
        import machina_dispatch

        return self._compile("bench_tools", self.build / "bench_tools.so",
                             ["-shared", "-fPIC", "-I", str(machina_dispatch.get_include())])


def run_lockstep(driver: Path, cmd: list[str], n: int, warmup: int, request: str, *, pre: Sequence[str] = (),
                 expect: str = '"ok":true', driver_cpu: int | None = None, host_cpu: int | None = None,
                 env: dict[str, str] | None = None, poll: bool = False) -> Latency:
    args = [str(driver), *(["-p"] if poll else [])]
    if driver_cpu is not None:
        args += ["-c", str(driver_cpu)]
    if host_cpu is not None:
        args += ["-C", str(host_cpu)]
    args += ["-e", expect, str(n), str(warmup), request, *pre, "--", *cmd]
    proc = subprocess.run(args, capture_output=True, env=env, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"lock-step driver failed ({proc.returncode}): {proc.stderr.decode(errors='replace')}")
    return Latency([float(x) for x in proc.stdout.split()])


def python_cmd(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def env_with(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent), env.get("PYTHONPATH", "")]))
    return env


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"cpus": len(os.sched_getaffinity(0)), "python": sys.version.split()[0]}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem = Path("/proc/meminfo").read_text().split()[1]
        info["memory_gib"] = round(int(mem) / 2**20, 1)
    except (OSError, IndexError, ValueError):
        pass
    info["kernel"] = os.uname().release
    return info
