"""--serve throughput, file-fed: N echo requests on stdin, responses to a file.

Reports requests per second (median and range over repetitions) for machina-toolhost
beside `cat` on the same file, the physical floor of moving those bytes through a
process. Also a non-identity tool, so the echo figure is not the only one.

    python bench/serve_throughput.py [--requests 200000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path


def toolhost() -> str:
    path = Path(sysconfig.get_path("scripts")) / "machina-toolhost"
    return str(path) if path.exists() else (shutil.which("machina-toolhost") or "machina-toolhost")


def timed(cmd: list[str], stdin: Path, stdout: Path) -> float:
    with stdin.open("rb") as fin, stdout.open("wb") as fout:
        start = time.perf_counter()
        subprocess.run(cmd, stdin=fin, stdout=fout, check=True)
        return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="machina-bench-"))
    echo_line = json.dumps({"aid": "AID.ECHO.v1", "input_json": json.dumps({"msg": "hello", "n": 1})})
    stats_line = json.dumps({"aid": "AID.TEXT.STATS.v1", "input_json": json.dumps({"text": "to be or not"})})
    files = {"echo": work / "echo.ndjson", "text_stats": work / "stats.ndjson"}
    files["echo"].write_text((echo_line + "\n") * args.requests)
    files["text_stats"].write_text((stats_line + "\n") * args.requests)
    out = work / "out.ndjson"

    host = toolhost()
    rows = []
    for name, cmd, src in [
        ("cat (floor)", ["cat"], files["echo"]),
        ("machina-toolhost --serve, AID.ECHO.v1", [host, "--serve"], files["echo"]),
        ("machina-toolhost --serve, AID.TEXT.STATS.v1", [host, "--serve"], files["text_stats"]),
    ]:
        times = [timed(cmd, src, out) for _ in range(args.repeat)]
        if cmd[0] == host:
            lines = out.read_bytes().count(b"\n")
            assert lines == args.requests, f"{lines} responses for {args.requests} requests"
            assert b'"ok":true' in out.read_bytes()[:200]
        rates = [args.requests / t for t in times]
        rows.append((name, statistics.median(rates), min(rates), max(rates)))
    shutil.rmtree(work)

    python = sys.version.split()[0]
    print(f"{args.requests} requests per run, {args.repeat} runs, {os.cpu_count()} CPUs, python {python}")
    print(f"{'command':<46} {'median req/s':>14} {'min':>12} {'max':>12}")
    for name, med, lo, hi in rows:
        print(f"{name:<46} {med:>14,.0f} {lo:>12,.0f} {hi:>12,.0f}")


if __name__ == "__main__":
    main()
