"""Runs the machina-toolhost benchmarks and writes a Markdown report with plots.

    pip install '.[bench]'
    python -m bench                  # every scenario, full size (about 10 minutes)
    python -m bench --quick          # every scenario, small (under 2 minutes)
    python -m bench --only serve lockstep --out results/
    python -m bench --only audit --reps 15   # more repetitions where a ratio is near the noise
    python -m bench --list           # the scenarios, in the order a full run takes them

Scenarios: the ones --only lists below (bench/scenarios/, a module per family). The report goes to
OUT/report.md with PNG plots and results.json beside it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

from . import report
from ._support import Native, machine, toolhost
from .scenarios import SCENARIOS, Ctx, Section


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes and 3 repetitions (under 2 minutes)")
    ap.add_argument("--out", type=Path, default=Path("bench-results"), help="results folder (default: %(default)s)")
    ap.add_argument("--only", nargs="+", choices=list(SCENARIOS), metavar="SCENARIO",
                    help=f"run only these: {', '.join(SCENARIOS)}")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar (e.g. in CI logs)")
    ap.add_argument("--list", action="store_true", help="print the scenarios' names and modules, and exit")
    ap.add_argument("--reps", type=int, metavar="N",
                    help="repetitions of each measured run (default: 5, --quick 3); more for a ratio near noise")
    args = ap.parse_args(argv)
    if args.reps is not None and args.reps < 1:
        ap.error("--reps must be at least 1")
    if args.list:
        for name, scenario in SCENARIOS.items():
            print(f"{name}\t{scenario.__module__}")
        return 0

    import machina_dispatch
    from tqdm import tqdm

    out: Path = args.out.resolve()  # scenarios hand paths beneath it to hosts working elsewhere
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="machina-bench-"))
    # The hosts measured keep their default audit store (as users run them), in the run's
    # work folder rather than the user's own state folder.
    os.environ["XDG_STATE_HOME"] = str(work / "state")
    names = args.only or list(SCENARIOS)
    started = time.time()
    sections: list[Section] = []
    failures: dict[str, str] = {}
    seconds: dict[str, float] = {}
    bar = tqdm(names, unit="scenario", disable=args.no_progress, dynamic_ncols=True)
    ctx = Ctx(quick=args.quick, out=out, work=work, host=toolhost(), native=Native(out / "native"),
              status=lambda text: bar.set_postfix_str(text[:60], refresh=True))
    if args.reps is not None:
        ctx.reps = args.reps
    try:
        for name in bar:
            bar.set_description(name)
            t0 = time.perf_counter()
            try:
                sections.append(SCENARIOS[name](ctx))
                seconds[name] = round(time.perf_counter() - t0, 1)
            except Exception as e:  # one broken scenario must not lose the others' figures
                failures[name] = f"{type(e).__name__}: {e}"
                traceback.print_exc(file=sys.stderr)
    finally:
        bar.close()
        shutil.rmtree(work, ignore_errors=True)
    meta = {"started": started, "elapsed_s": time.time() - started, "quick": args.quick,
            "command": " ".join(["python -m bench", *(argv if argv is not None else sys.argv[1:])]),
            "machine": machine(), "version": machina_dispatch.__version__, "scenario_seconds": seconds}
    path = report.write(out, sections, failures, meta)
    print(f"report: {path} ({meta['elapsed_s']:.0f} s)")
    print(report.goals_table(sections))
    if failures:
        print(f"failed scenarios: {', '.join(failures)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
