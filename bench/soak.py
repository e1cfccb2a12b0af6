"""Soak: drive one `machina-toolhost --serve` with mixed load for a long time and record
its memory over time, to show that nothing grows without bound.

The load mixes cheap and schema-checked tools, ds_state writes and reads, idempotency
keys (most unique, some repeated), invalid requests and, from the test plugins, tools that
fail, print to stdout, overrun their deadline and — with --isolation process — crash their
worker. Requests are pipelined with a bounded number in flight. Every second the host's
resident memory (VmRSS, plus its workers' in process isolation) and the requests answered
so far are recorded.

    python bench/soak.py --minutes 10 --isolation process --out bench/results/soak

writes soak.csv (time, requests, host RSS, workers' RSS), soak.png (with matplotlib) and
prints a summary: RSS over the first and last minute and the fitted slope in KiB/minute.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def toolhost() -> str:
    from machina_dispatch import find_executable

    found = find_executable()
    if not found:
        sys.exit("machina-toolhost is not installed (pip install .)")
    return found


def build_test_plugins(into: Path) -> Path:
    import machina_dispatch

    cmake = shutil.which("cmake") or "cmake"
    subprocess.run([cmake, "-S", str(REPO / "tests" / "plugins"), "-B", str(into),
                    f"-DMACHINA_PLUGIN_INCLUDE={machina_dispatch.get_include()}", "-DCMAKE_BUILD_TYPE=Release"],
                   check=True, capture_output=True)
    subprocess.run([cmake, "--build", str(into)], check=True, capture_output=True)
    return into / "misbehaving_tools.so"


def request(rng: random.Random, n: int, isolated: bool) -> dict[str, Any]:
    roll = rng.random()
    if roll < 0.40:
        return {"id": n, "aid": "AID.ECHO.v1", "input_json": json.dumps({"n": n, "s": "x" * rng.randrange(200)})}
    if roll < 0.55:
        return {"id": n, "aid": "AID.TEXT.STATS.v1", "input_json": json.dumps({"text": "a b c " * rng.randrange(50)})}
    if roll < 0.65:
        return {"id": n, "aid": "AID.STATE.PUT.v1",
                "input_json": json.dumps({"slot": rng.randrange(8), "type": "t", "content": {"n": n}})}
    if roll < 0.70:
        return {"id": n, "aid": "AID.STATE.GET.v1", "input_json": json.dumps({"slot": rng.randrange(8)})}
    if roll < 0.85:
        # Unique keys fill and churn the bounded cache; a few repeat within its TTL.
        key = f"k{n}" if rng.random() < 0.9 else f"hot{rng.randrange(100)}"
        return {"id": n, "aid": "AID.ECHO.v1", "input_json": json.dumps({"k": key}), "idempotency_key": key}
    if roll < 0.88:
        return {"id": n, "aid": "AID.ECHO.v1", "input_json": "{broken"}
    if roll < 0.91:
        return {"id": n, "aid": "AID.NOPE.v1"}
    if roll < 0.95:
        return {"id": n, "aid": "AID.TEST.FAIL.v1"}
    if roll < 0.97:
        return {"id": n, "aid": "AID.TEST.PRINT.v1"}
    if roll < 0.985:
        return {"id": n, "aid": "AID.TEST.SLOW.v1", "input_json": json.dumps({"ms": 30}), "timeout_ms": 10}
    if isolated:
        return {"id": n, "aid": rng.choice(["AID.TEST.CRASH.v1", "AID.TEST.ABORT.v1", "AID.TEST.EXIT.v1"])}
    return {"id": n, "aid": "AID.TEST.THROW.v1"}


def rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--isolation", choices=["inline", "process"], default="process")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--in-flight", type=int, default=2000, help="most requests sent but not yet answered")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "soak")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory() as tmp:
        plugin = build_test_plugins(Path(tmp) / "plugins")
        import machina_dispatch

        cmd = [toolhost(), "--serve", "--workers", str(args.workers), "--isolation", args.isolation,
               "--plugin", str(plugin), "--plugin", str(machina_dispatch.builtin_plugin_path()),
               "--breaker-threshold", "1000000", "--idempotency-max-entries", "1024"]
        host = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert host.stdin is not None and host.stdout is not None
        room = threading.Semaphore(args.in_flight)
        answered = 0
        sent = 0
        stop = threading.Event()
        errors: list[str] = []

        def feed() -> None:
            nonlocal sent
            rng = random.Random(1)
            assert host.stdin is not None
            while not stop.is_set():
                batch = []
                for _ in range(100):
                    room.acquire()
                    batch.append(json.dumps(request(rng, sent, args.isolation == "process")).encode() + b"\n")
                    sent += 1
                host.stdin.write(b"".join(batch))
                host.stdin.flush()
            host.stdin.close()

        def drain() -> None:
            nonlocal answered
            assert host.stdout is not None
            for line in host.stdout:
                try:
                    json.loads(line)
                except ValueError:
                    errors.append(line[:200].decode(errors="replace"))
                answered += 1
                room.release()

        feeder = threading.Thread(target=feed, daemon=True)
        reader = threading.Thread(target=drain, daemon=True)
        feeder.start()
        reader.start()

        rows: list[tuple[float, int, int, int]] = []
        start = time.monotonic()
        end = start + args.minutes * 60
        while time.monotonic() < end and host.poll() is None:
            time.sleep(1.0)
            workers_rss = sum(rss_kib(c) for c in children(host.pid)) if args.isolation == "process" else 0
            rows.append((time.monotonic() - start, answered, rss_kib(host.pid), workers_rss))
        stop.set()
        feeder.join(timeout=30)
        reader.join(timeout=60)
        host.wait(timeout=60)

    with open(args.out / "soak.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["seconds", "requests_answered", "host_rss_kib", "workers_rss_kib"])
        w.writerows(rows)

    def mean(xs: list[int]) -> float:
        return sum(xs) / max(len(xs), 1)

    first = [r[2] for r in rows if r[0] <= 60]
    last = [r[2] for r in rows if r[0] >= rows[-1][0] - 60]
    n = len(rows)
    mx, my = mean([int(r[0]) for r in rows]), mean([r[2] for r in rows])
    slope = (sum((r[0] - mx) * (r[2] - my) for r in rows) / max(sum((r[0] - mx) ** 2 for r in rows), 1e-9)) * 60
    print(f"{answered} requests answered in {rows[-1][0]:.0f} s ({answered / rows[-1][0]:,.0f}/s), "
          f"host exit code {host.returncode}, {len(errors)} unparsable responses")
    print(f"host RSS: first minute {mean(first):,.0f} KiB, last minute {mean(last):,.0f} KiB, "
          f"peak {max(r[2] for r in rows):,} KiB, fitted slope {slope:+.1f} KiB/min over {n} samples")
    if args.isolation == "process":
        print(f"workers' RSS (sum): last {rows[-1][3]:,} KiB")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 4))
        ax.plot([r[0] / 60 for r in rows], [r[2] / 1024 for r in rows], label="host RSS")
        if args.isolation == "process":
            ax.plot([r[0] / 60 for r in rows], [r[3] / 1024 for r in rows], label="workers' RSS (sum)")
        ax.set_xlabel("minutes")
        ax.set_ylabel("MiB")
        ax.set_ylim(bottom=0)
        ax.set_title(f"soak: --serve --isolation {args.isolation}, {answered:,} mixed requests")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.out / "soak.png", dpi=100)
        print(f"plot: {args.out / 'soak.png'}")
    except ImportError:
        print("(matplotlib not installed: no plot)")
    return 0 if host.returncode == 0 and not errors else 1


if __name__ == "__main__":
    raise SystemExit(main())
