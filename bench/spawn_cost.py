"""--run cost as seen from Python: subprocess.run of `machina-toolhost --run AID.ECHO.v1`
beside subprocess.run of /bin/true, interleaved in one run, medians over many calls.

    python bench/spawn_cost.py [--calls 500]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sysconfig
import time
from pathlib import Path


def toolhost() -> str:
    path = Path(sysconfig.get_path("scripts")) / "machina-toolhost"
    return str(path) if path.exists() else (shutil.which("machina-toolhost") or "machina-toolhost")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=500)
    args = ap.parse_args()
    cases = {
        "/bin/true": (["/bin/true"], b"{}"),
        "machina-toolhost --version": ([toolhost(), "--version"], b""),
        "machina-toolhost --run AID.ECHO.v1": ([toolhost(), "--run", "AID.ECHO.v1"], b'{"input_json":"{\\"a\\":1}"}'),
    }
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.calls):  # interleaved, so drift in machine load hits every case alike
        for name, (cmd, stdin) in cases.items():
            start = time.perf_counter()
            proc = subprocess.run(cmd, input=stdin, capture_output=True)
            samples[name].append(time.perf_counter() - start)
            assert proc.returncode == 0, proc.stderr
    base = statistics.median(samples["/bin/true"])
    print(f"{args.calls} calls each, interleaved")
    print(f"{'command':<36} {'median ms':>10} {'p90 ms':>8} {'vs /bin/true':>13}")
    for name, xs in samples.items():
        xs.sort()
        med = statistics.median(xs)
        print(f"{name:<36} {med * 1e3:>10.3f} {xs[int(len(xs) * 0.9)] * 1e3:>8.3f} {med / base:>12.2f}x")


if __name__ == "__main__":
    main()
