"""Fault injection: 10 000 requests through `--serve --workers 8 --isolation process`,
with about 1% each of tools that crash, abort, exit, hang, print to stdout and produce
huge output mixed in. Every request must be answered exactly once with the right status
and error, the host must end cleanly, and its memory must stay bounded."""

from __future__ import annotations

import json
import random
import subprocess
import threading
from collections import Counter
from typing import Any

import machina_dispatch
from conftest import SANITIZED, TOOLHOST, base_env

TOTAL = 10_000
FAULTS = ("CRASH", "ABORT", "EXIT", "HANG", "PRINT", "HUGE")


def build_requests(seed: int) -> tuple[list[dict[str, Any]], dict[int, str]]:
    rng = random.Random(seed)
    requests: list[dict[str, Any]] = []
    kinds: dict[int, str] = {}
    for i in range(TOTAL):
        roll = rng.random()
        kind = FAULTS[int(roll * 100)] if roll < len(FAULTS) / 100 else "ECHO"
        kinds[i] = kind
        if kind == "ECHO":
            requests.append({"id": i, "aid": "AID.ECHO.v1", "input_json": json.dumps({"n": i, "pad": "p" * (i % 50)})})
        elif kind == "HANG":
            requests.append({"id": i, "aid": "AID.TEST.HANG.v1", "timeout_ms": 200})
        else:
            requests.append({"id": i, "aid": f"AID.TEST.{kind}.v1"})
    return requests, kinds


def check(kind: str, i: int, r: dict[str, Any]) -> None:
    if kind == "ECHO":
        assert r["ok"] is True and json.loads(r["output_json"]) == {"n": i, "pad": "p" * (i % 50)}, r
        return
    assert r["ok"] is (kind == "PRINT"), r
    if kind == "PRINT":
        assert json.loads(r["output_json"]) == {"printed": True}
        return
    assert r["status"] == "TOOL_ERROR", r
    expected_code = {"CRASH": "tool_crashed", "ABORT": "tool_crashed", "EXIT": "tool_crashed", "HANG": "timeout",
                     "HUGE": "output_too_large"}[kind]
    assert r["code"] == expected_code, r
    if kind == "CRASH":
        assert "was killed by signal 11 (SIGSEGV" in r["error"]
    elif kind == "ABORT":
        assert "was killed by signal 6 (SIGABRT" in r["error"]
    elif kind == "EXIT":
        assert "exited with status 3" in r["error"]
    elif kind == "HANG":
        assert r["error"] == "timeout: AID.TEST.HANG.v1 did not finish within 200 ms"


def vm_hwm_kib(pid: int) -> int:
    """The peak resident set (KiB) of a running process; 0 once it has ended."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def test_ten_thousand_requests_with_faults(misbehaving: str) -> None:
    requests, kinds = build_requests(seed=20261122)
    counts = Counter(kinds.values())
    for kind in FAULTS:
        assert 60 <= counts[kind] <= 140, counts  # about 1% each

    data = b"".join(json.dumps(r).encode() + b"\n" for r in requests)
    proc = subprocess.Popen(
        [TOOLHOST, "--serve", "--workers", "8", "--isolation", "process",
         "--plugin", misbehaving, "--plugin", str(machina_dispatch.builtin_plugin_path()),
         "--breaker-threshold", "1000000"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=base_env())
    assert proc.stdin is not None and proc.stdout is not None
    stdin = proc.stdin

    def feed() -> None:
        stdin.write(data)
        stdin.close()

    # The host's own peak RSS is its VmHWM, sampled while it runs. (ru_maxrss from wait4
    # would not do: Linux carries the spawning process's high-water mark across exec, so
    # it reports this test runner's size once that is the larger.)
    peak_kib = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak_kib
        while not done.wait(0.005):
            peak_kib = max(peak_kib, vm_hwm_kib(proc.pid))

    writer = threading.Thread(target=feed)
    sampler = threading.Thread(target=sample)
    writer.start()
    sampler.start()
    out = proc.stdout.read()
    writer.join()
    done.set()
    sampler.join()
    assert proc.wait(timeout=30) == 0

    lines = out.splitlines()
    assert len(lines) == TOTAL, f"{len(lines)} responses for {TOTAL} requests"
    seen: Counter[int] = Counter()
    for line in lines:
        r = json.loads(line)
        seen[r["id"]] += 1
        check(kinds[r["id"]], r["id"], r)
    assert set(seen) == set(range(TOTAL)) and max(seen.values()) == 1, "every request answered exactly once"
    # Under ASan (scripts/sanitize-tests.sh) shadow memory and the allocator's redzones
    # roughly double the footprint.
    assert peak_kib > 0, "the host's VmHWM was never read"
    assert peak_kib < (400 if SANITIZED else 200) * 1024, f"host peak RSS {peak_kib} KiB"


def test_host_memory_stays_flat_under_faults(misbehaving: str) -> None:
    """The host's resident memory after 5 000 mixed requests is not above what it was
    after the first 1 000 by more than a small margin (no leak per request)."""
    requests, _ = build_requests(seed=7)
    proc = subprocess.Popen(
        [TOOLHOST, "--serve", "--workers", "4", "--isolation", "process",
         "--plugin", misbehaving, "--plugin", str(machina_dispatch.builtin_plugin_path()),
         "--breaker-threshold", "1000000"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=base_env())
    assert proc.stdin is not None and proc.stdout is not None

    def send_and_read(batch: list[dict[str, Any]]) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(b"".join(json.dumps(r).encode() + b"\n" for r in batch))
        proc.stdin.flush()
        for _ in batch:
            assert proc.stdout.readline()

    def rss_kib() -> int:
        for line in open(f"/proc/{proc.pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    try:
        send_and_read(requests[:1000])
        after_first = rss_kib()
        for start in range(1000, 5000, 1000):
            send_and_read(requests[start:start + 1000])
        after_all = rss_kib()
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    assert proc.returncode == 0
    # Under ASan, freed memory waits in its 16 MiB quarantine (plus its allocator's caches,
    # 4 MiB more) before reuse.
    allowance = (4 + (16 + 4 if SANITIZED else 0)) * 1024
    assert after_all <= after_first + allowance, f"RSS grew from {after_first} KiB to {after_all} KiB"
