"""Spinning for quick answers (--spin-us, Pool(spin_us=...)): a serve host polls for
its next request, and a lone pool caller for its answer, for a bounded time before they
sleep; neither spins when it may use only one CPU."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable

import machina_dispatch as md
import pytest
from conftest import TOOLHOST, base_env, echo

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")

needs_two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="spinning needs two CPUs")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process, from the process table."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


def host_cpu_over_spaced_calls(*args: str, calls: int = 20, gap_s: float = 0.03,
                               preexec_fn: Callable[[], None] | None = None) -> float:
    """CPU seconds a --serve host uses while answering `calls` echo requests sent `gap_s`
    apart (after its start-up is over)."""
    p = subprocess.Popen([TOOLHOST, "--serve", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         env=base_env(), preexec_fn=preexec_fn)
    stdin, stdout = p.stdin, p.stdout
    assert stdin and stdout
    try:
        def call(i: int) -> None:
            stdin.write(json.dumps(echo(i, id=i)).encode() + b"\n")
            stdin.flush()
            assert json.loads(stdout.readline())["id"] == i

        call(-1)
        time.sleep(0.05)
        before = cpu_seconds(p.pid)
        for i in range(calls):
            call(i)
            time.sleep(gap_s)
        return cpu_seconds(p.pid) - before
    finally:
        stdin.close()
        assert p.wait(timeout=10) == 0


@pytest.mark.parametrize("value", ["-1", "10001", "x"])
def test_spin_range_is_checked(value: str) -> None:
    proc = subprocess.run([TOOLHOST, "--serve", "--spin-us", value], input=b"", capture_output=True,
                          env=base_env(), timeout=10)
    assert proc.returncode == 2
    assert b"--spin-us" in proc.stderr
    assert proc.stdout == b""


@needs_two_cpus
def test_a_serve_host_spins_at_most_its_limit_after_each_answer() -> None:
    # 20 gaps of 30 ms with a 10 ms spin limit: a host that spins its limit after each
    # answer uses 20 x 10 ms of CPU, one that kept spinning 20 x 30 ms, one that never
    # spins next to nothing.
    spinning = host_cpu_over_spaced_calls("--spin-us", "10000")
    assert 0.1 <= spinning <= 0.35
    assert host_cpu_over_spaced_calls("--spin-us", "0") <= 0.05


@needs_two_cpus
def test_a_host_allowed_one_cpu_does_not_spin() -> None:
    one_cpu = min(os.sched_getaffinity(0))
    used = host_cpu_over_spaced_calls("--spin-us", "10000", preexec_fn=lambda: os.sched_setaffinity(0, {one_cpu}))
    assert used <= 0.05


def test_pool_passes_its_spin_to_its_hosts_and_checks_it() -> None:
    with md.Pool(executable=TOOLHOST, env=base_env(), spin_us=123) as pool:
        assert pool.call("AID.ECHO.v1", [1]).output == [1]
        (pid,) = pool.pids()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        assert argv[argv.index(b"--spin-us") + 1] == b"123"
    # The host's own option in args comes last and wins there.
    with md.Pool(executable=TOOLHOST, env=base_env(), args=["--spin-us", "0"]) as pool:
        assert pool.call("AID.ECHO.v1", [2]).output == [2]
    for bad in (-1, 10_001, 12.5):
        with pytest.raises(ValueError, match="spin_us must be a whole number from 0 to 10000"):
            md.Pool(executable=TOOLHOST, spin_us=bad)  # type: ignore[arg-type]  # 12.5: not an int, refused


@needs_two_cpus
def test_a_lone_caller_spins_at_most_its_limit(misbehaving: str) -> None:
    # A 10 ms spin, then sleep: waiting 20 times for a 30 ms tool takes 20 x 10 ms of
    # this process's CPU, not the 20 x 30 ms of waiting on the CPU throughout.
    plugins = [misbehaving]
    with md.Pool(executable=TOOLHOST, plugins=plugins, env=base_env(), spin_us=10_000) as pool:
        pool.call("AID.TEST.SLOW.v1", {"ms": 1})
        before = time.process_time()
        for _ in range(20):
            assert pool.call("AID.TEST.SLOW.v1", {"ms": 30}).ok
        used = time.process_time() - before
    assert 0.1 <= used <= 0.4
    with md.Pool(executable=TOOLHOST, plugins=plugins, env=base_env(), spin_us=0) as pool:
        pool.call("AID.TEST.SLOW.v1", {"ms": 1})
        before = time.process_time()
        for _ in range(20):
            assert pool.call("AID.TEST.SLOW.v1", {"ms": 30}).ok
        assert time.process_time() - before <= 0.08
