"""The tool packs: file read, code.grep and code.search."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .._support import HERE, env_with, ratio, run_lockstep, us
from ._context import Ctx, Section, Table

GREP_MISS = "no_line_has_this_xq7v"  # a pattern nothing matches: every file is read


def packs(ctx: Ctx) -> Section:
    import machina_dispatch as md

    repo = HERE.parent
    s = Section("packs", "Tool packs: file read, code.grep and code.search",
                "File read: a 100-byte file read by `readFile` lock-step through `--serve` (the native "
                "driver) and through `InProcess` from Python, against Python reading it directly "
                "(`Path.read_text`). Grep: a pattern no line has, so every file is read, over this "
                "repository: `code.grep` through `--serve` (rg under the hood, sorted, .gitignore "
                "respected), `rg` run directly the same way, and plain `grep -rn` (which also reads "
                "what .gitignore excludes: the virtual environment and build folders), and `grep -rn` "
                "told to skip them. Search: `code.search` over this repository through `--serve`, the first "
                "search of a fresh index (every file read and indexed) and a warm one (nothing changed: "
                "every file checked, none read).")
    driver = ctx.native.lockstep()
    ws = ctx.work / "packs-ws"
    ws.mkdir(exist_ok=True)
    (ws / "small.txt").write_text("x" * 99 + "\n")
    n = ctx.n(5_000, 50_000)
    read_req = json.dumps({"aid": "readFile", "input_json": json.dumps({"path": "small.txt"})})
    ctx.status("file read")
    env = env_with(MACHINA_TOOLHOST_WORKSPACE=str(ws))
    served = run_lockstep(driver, [ctx.host, "--serve"], n, 1000, read_req, env=env)
    small = ws / "small.txt"
    t0 = time.perf_counter_ns()
    for _ in range(n):
        small.read_text()
    direct_ns = (time.perf_counter_ns() - t0) / n
    old = os.environ.get("MACHINA_TOOLHOST_WORKSPACE")
    os.environ["MACHINA_TOOLHOST_WORKSPACE"] = str(ws)
    try:
        with md.InProcess(packs=["files"]) as host:
            host.call("readFile", {"path": "small.txt"})
            t0 = time.perf_counter_ns()
            for _ in range(n):
                host.call("readFile", {"path": "small.txt"})
            inproc_ns = (time.perf_counter_ns() - t0) / n
    finally:
        if old is None:
            del os.environ["MACHINA_TOOLHOST_WORKSPACE"]
        else:
            os.environ["MACHINA_TOOLHOST_WORKSPACE"] = old
    s.headline["pack_read_serve_p50_us"] = served.p(50) / 1e3
    s.headline["pack_read_inprocess_us"] = inproc_ns / 1e3
    s.tables.append(Table(f"Reading a 100-byte file, {n:,} times each",
                          ["how", "µs per read", "÷ direct"],
                          [["readFile via --serve (lock-step p50)", us(served.p(50)), ratio(served.p(50), direct_ns)],
                           ["readFile via InProcess", f"{inproc_ns / 1e3:.2f}", ratio(inproc_ns, direct_ns)],
                           ["Path.read_text() in Python", f"{direct_ns / 1e3:.2f}", "1.00×"]]))

    ctx.status("grep over the repository")
    rg = shutil.which("rg") or str(Path(sys.executable).parent / "rg")
    reps = ctx.n(3, 10)

    def timed(cmd: list[str], **kw: Any) -> float:
        def once() -> float:
            t = time.perf_counter()
            subprocess.run(cmd, capture_output=True, timeout=600, **kw)
            return time.perf_counter() - t
        return statistics.median(once() for _ in range(reps))

    grep_req = json.dumps({"aid": "grepCode", "input_json": json.dumps({"pattern": GREP_MISS})})
    via = run_lockstep(driver, [ctx.host, "--serve"], reps, 1, grep_req,
                       env=env_with(MACHINA_TOOLHOST_WORKSPACE=str(repo)))
    rg_s = timed([rg, "--json", "--no-config", "--sort", "path", GREP_MISS, str(repo)])
    grep_s = timed(["grep", "-rn", GREP_MISS, str(repo)])
    grep_x = timed(["grep", "-rn", "--exclude-dir=.venv", "--exclude-dir=build", "--exclude-dir=.git", GREP_MISS,
                    str(repo)])
    via_s = via.p(50) / 1e9
    s.headline["grep_vs_grep_rn_ratio"] = grep_s / via_s
    s.tables.append(Table(f"One search of this repository (median of {reps})",
                          ["how", "ms", "grep -rn ÷ this"],
                          [["code.grep via --serve", f"{via_s * 1e3:.1f}", ratio(grep_s, via_s)],
                           ["rg directly (the same flags)", f"{rg_s * 1e3:.1f}", ratio(grep_s, rg_s)],
                           ["grep -rn", f"{grep_s * 1e3:.1f}", "1.00×"],
                           ["grep -rn, skipping .venv, build, .git", f"{grep_x * 1e3:.1f}", ratio(grep_s, grep_x)]]))

    # code.search: the first search builds its index (a fresh index folder each time), a warm
    # one finds every file unchanged.
    ctx.status("code.search over the repository")
    search_req = json.dumps({"aid": "AID.CODE.SEARCH.v1",
                             "input_json": json.dumps({"query": "idempotency cache eviction"})})
    search_env = env_with(MACHINA_TOOLHOST_WORKSPACE=str(repo))
    firsts = []
    policy = ctx.work / "code-index.toml"
    for i in range(reps):
        policy.write_text(f'[code]\nindex_dir = "{ctx.work / f"code-index-{i}"}"\n')
        firsts.append(run_lockstep(driver, [ctx.host, "--serve", "--policy", str(policy)], 1, 0, search_req,
                                   env=search_env).p(50))
    warm = run_lockstep(driver, [ctx.host, "--serve", "--policy", str(policy)], ctx.n(20, 100), 1, search_req,
                        env=search_env)
    done = subprocess.run([ctx.host, "--serve", "--policy", str(policy)], input=(search_req + "\n").encode(),
                          capture_output=True, env=search_env, timeout=600, check=True)
    index = json.loads(json.loads(done.stdout)["output_json"])["index"]
    first_s, warm_s = statistics.median(firsts) / 1e9, warm.p(50) / 1e9
    s.headline["code_search_first_ms"] = first_s * 1e3
    s.headline["code_search_warm_ms"] = warm_s * 1e3
    s.tables.append(Table(f"code.search over this repository ({index['files']:,} files indexed, "
                          f"{sum(p.stat().st_size for p in (ctx.work / 'code-index-0').glob('*.sqlite')) / 1e6:.1f} MB "
                          "of index)",
                          ["how", "ms", "files"],
                          [[f"first search: the index built (median of {reps})", f"{first_s * 1e3:.1f}",
                            f"{index['files']:,} indexed"],
                           [f"warm search: nothing changed (p50 of {len(warm.ns):,})", f"{warm_s * 1e3:.1f}",
                            f"{index['unchanged']:,} checked, {index['bytes_read']} bytes read"],
                           ["code.grep via --serve, for scale", f"{via_s * 1e3:.1f}", "every one read"]]))
    return s
