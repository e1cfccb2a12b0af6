"""Python tools: the interpreter's worker pool beside an interpreter per call and an HTTP
tool service, and the execute_python pack."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .._support import Latency, env_with, ratio, repeat, run_lockstep, spread_rate, us
from ._context import Ctx, Section, Table

PY_ECHO_TOOL = 'def echo(payload):\n    return payload\n'


# A tool protocol v1 runner that starts one interpreter per call (docs/specifications.md).
FRESH_RUNNER = (
    "import importlib, io, json, sys, contextlib\n"
    "req = json.loads(sys.stdin.read())\n"
    "sys.path.insert(0, '.')\n"
    "mod, fn = req['entry'].split(':')\n"
    "f = getattr(importlib.import_module(mod), fn)\n"
    "with contextlib.redirect_stdout(io.StringIO()):\n"
    "    r = f(req.get('payload', {}))\n"
    "sys.stdout.write(json.dumps({'ok': True, 'protocol_version': 1, 'result': r}))\n")


def python_pack(ctx: Ctx) -> Path:
    """A pack with one trivial Python tool (it returns its payload)."""
    pack = ctx.work / "python-pack"
    (pack / "benchtools").mkdir(parents=True, exist_ok=True)
    (pack / "benchtools" / "__init__.py").write_text("")
    (pack / "benchtools" / "echo.py").write_text(PY_ECHO_TOOL)
    manifest = pack / "tools.toml"
    manifest.write_text(f'[[tool]]\naid = "AID.PY.ECHO.v1"\nrunner = "python"\nentry = "benchtools.echo:echo"\n'
                        f'python = "{sys.executable}"\n')
    return manifest


def python_tools(ctx: Ctx) -> Section:
    import machina_dispatch as md

    s = Section("python_tools", "Python tools and HTTP tool services",
                "A trivial Python tool (it returns its payload) declared in a tool manifest and run by the "
                "Python runner: warm worker interpreters of the package's tool worker, tool protocol v1 on "
                "their pipes. Baseline in the same run: a runner that starts a fresh interpreter per "
                "call (`python -c <runner>` with the request on stdin). Lock-step: the native driver "
                "(bench/native/lockstep.c) against `--serve`, one request at a time, unpinned. Pipelined: "
                "`Pool.call_many` from one Python thread, host `--workers 8`, two Python workers. Services: "
                "the same tool behind `machina-toolhost --http`, called through a service tool of a second "
                "host (keep-alive connection), against calling it directly.")
    manifest = python_pack(ctx)
    driver = ctx.native.lockstep()
    n = ctx.n(5_000, 50_000)
    request = json.dumps({"aid": "AID.PY.ECHO.v1", "input_json": json.dumps({"msg": "hello", "n": 1})})
    ctx.status("python tool lock-step")
    direct = run_lockstep(driver, [ctx.host, "--serve", "--tools", str(manifest)], n, 500, request)
    rows = [["Python tool via --serve (warm worker)", us(direct.p(50)), us(direct.p(99)), "1.00×"]]
    s.headline["python_lockstep_p50_us"] = direct.p(50) / 1e3

    # A fresh interpreter per call (FRESH_RUNNER).
    ctx.status("fresh interpreter per call")
    call_json = json.dumps({"protocol_version": 1, "tool": "echo", "entry": "benchtools.echo:echo",
                            "payload": {"msg": "hello", "n": 1}}).encode()
    fresh = []
    for _ in range(ctx.n(20, 100)):
        t0 = time.perf_counter_ns()
        out = subprocess.run([sys.executable, "-c", FRESH_RUNNER], input=call_json, capture_output=True,
                             cwd=manifest.parent, check=True).stdout
        fresh.append(float(time.perf_counter_ns() - t0))
        assert json.loads(out)["ok"]
    fresh_lat = Latency(fresh)
    rows.append(["a fresh interpreter per call (FRESH_RUNNER)", us(fresh_lat.p(50)), us(fresh_lat.p(99)),
                 ratio(fresh_lat.p(50), direct.p(50))])
    s.headline["python_fresh_ratio"] = fresh_lat.p(50) / direct.p(50)

    # The same tool behind --http, through a service tool.
    ctx.status("service round trip")
    http_host = subprocess.Popen([ctx.host, "--http", "127.0.0.1:0", "--tools", str(manifest)],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert http_host.stderr is not None
        port = http_host.stderr.readline().decode().rsplit(":", 1)[1].strip()
        svc = ctx.work / "service-pack" / "tools.toml"
        svc.parent.mkdir(exist_ok=True)
        svc.write_text(f'[[tool]]\naid = "AID.SVC.ECHO.v1"\nrunner = "service"\nurl = "http://127.0.0.1:{port}/run"\n'
                       f'name = "AID.PY.ECHO.v1"\n')
        via = run_lockstep(driver, [ctx.host, "--serve", "--tools", str(svc)], n, 500,
                           request.replace("AID.PY.ECHO.v1", "AID.SVC.ECHO.v1"))
        plugin_req = request.replace("AID.PY.ECHO.v1", "AID.ECHO.v1")
        svc.write_text(svc.read_text() + f'\n[[tool]]\naid = "AID.SVC.PLUGIN.v1"\nrunner = "service"\n'
                       f'url = "http://127.0.0.1:{port}/run"\nname = "AID.ECHO.v1"\n')
        plugin_direct = run_lockstep(driver, [ctx.host, "--serve"], n, 500, plugin_req)
        plugin_via = run_lockstep(driver, [ctx.host, "--serve", "--tools", str(svc)], n, 500,
                                  request.replace("AID.PY.ECHO.v1", "AID.SVC.PLUGIN.v1"))
    finally:
        http_host.terminate()
        http_host.wait(timeout=10)
    rows.append(["the same Python tool through a service tool (--serve → --http → worker)", us(via.p(50)),
                 us(via.p(99)), ratio(via.p(50), direct.p(50))])
    rows.append(["echo plugin, direct (--serve)", us(plugin_direct.p(50)), us(plugin_direct.p(99)),
                 ratio(plugin_direct.p(50), direct.p(50))])
    rows.append(["echo plugin through a service tool (--serve → --http)", us(plugin_via.p(50)), us(plugin_via.p(99)),
                 ratio(plugin_via.p(50), direct.p(50))])
    s.headline["service_added_us"] = (via.p(50) - direct.p(50)) / 1e3
    s.tables.append(Table(f"Lock-step round trips ({n:,} each; {len(fresh):,} fresh interpreters); "
                          "last column: this row's p50 ÷ the warm Python tool's",
                          ["how", "p50 µs", "p99 µs", "÷ warm Python tool"], rows))

    # Pipelined from Python.
    n_pipe = ctx.n(10_000, 40_000)
    prow = []
    for host_workers in (2, 8):
        with md.Pool(1, executable=ctx.host, tools=[str(manifest)], workers=host_workers,
                     args=["--python-workers", "2"]) as pool:
            calls = [("AID.PY.ECHO.v1", {"msg": "hello", "n": 1})] * n_pipe
            pool.call_many(calls[:2000])
            ctx.status(f"python tools pipelined, --workers {host_workers}")

            def once(pool: md.Transport = pool, calls: list[tuple[str, Any]] = calls) -> float:
                start = time.perf_counter()
                results = pool.call_many(calls)
                elapsed = time.perf_counter() - start
                assert all(r.ok for r in results)
                return n_pipe / elapsed

            sp = repeat(once, ctx.reps)
            prow.append([f"--workers {host_workers}, 2 Python workers", spread_rate(sp),
                         ratio(sp.median, 1e9 / fresh_lat.p(50))])
            s.headline["python_pipelined_cps"] = max(s.headline.get("python_pipelined_cps", 0.0), sp.median)
    s.tables.append(Table(f"Pipelined: Pool.call_many of {n_pipe:,} calls, {ctx.reps} runs",
                          ["host", "calls/s (min–max)", "÷ a fresh interpreter per call"], prow))
    return s


def python_exec(ctx: Ctx) -> Section:
    s = Section("python_exec", "execute_python: sandboxed interpreters against python -c",
                "The same small piece of code (`sum(range(100))`) run by `execute_python` lock-step through "
                "`--serve` (the native driver): without a session (an interpreter of its own and a new folder "
                "each call: the workspace's interpreters, started ahead, each run one call and are then "
                "retired) and in one session (its reserved, warm interpreter); against "
                "starting the interpreter the workspace's environment is made from for each call "
                "(`python3 -c '...'`, no sandbox at all). Every execute_python call runs in the full walls "
                "(namespaces, seccomp, Landlock, limits) and answers execute_python's fields.")
    code = "sum(range(100))"
    work = ctx.work / "python-exec"
    (work / "ws").mkdir(parents=True, exist_ok=True)
    policy = work / "policy.toml"
    policy.write_text(f"[python]\nworkspaces = {json.dumps(str(work / 'workspaces'))}\n"
                      f"python = {json.dumps(sys.executable)}\n")
    driver = ctx.native.lockstep()
    # A call without a session waits for an interpreter to start when it follows another at once.
    counts = {"stateless": ctx.n(200, 1_000), "session": ctx.n(2_000, 20_000)}
    env = env_with(MACHINA_TOOLHOST_WORKSPACE=str(work / "ws"))
    expect = '\\"success\\":true'
    results = {}
    for label, inputs in (("stateless", {"code": code}), ("session", {"code": code, "session_id": "bench"})):
        ctx.status(f"execute_python, {label}")
        request = json.dumps({"aid": "execute_python", "input_json": json.dumps(inputs)})
        results[label] = run_lockstep(driver, [ctx.host, "--serve", "--policy", str(policy)], counts[label],
                                      min(200, counts[label] // 10), request, expect=expect, env=env)
    ctx.status("python -c per call")
    base = getattr(sys, "_base_executable", sys.executable)
    fresh = []
    for _ in range(ctx.n(20, 100)):
        t0 = time.perf_counter_ns()
        out = subprocess.run([base, "-c", f"print({code})"], capture_output=True, check=True).stdout
        fresh.append(float(time.perf_counter_ns() - t0))
        assert out.strip() == b"4950"
    fresh_lat = Latency(fresh)
    stateless, session = results["stateless"], results["session"]
    s.headline["python_exec_p50_us"] = stateless.p(50) / 1e3
    s.headline["python_exec_session_p50_us"] = session.p(50) / 1e3
    s.headline["python_exec_fresh_ratio"] = fresh_lat.p(50) / stateless.p(50)
    s.tables.append(Table(f"Lock-step round trips ({counts['stateless']:,} execute_python calls without a session, "
                          f"{counts['session']:,} in one; {len(fresh):,} interpreters "
                          "started); last column: python -c's p50 ÷ this row's",
                          ["how", "p50 µs", "p99 µs", "python -c ÷ this"],
                          [["execute_python via --serve, no session", us(stateless.p(50)), us(stateless.p(99)),
                            ratio(fresh_lat.p(50), stateless.p(50))],
                           ["execute_python via --serve, one session", us(session.p(50)), us(session.p(99)),
                            ratio(fresh_lat.p(50), session.p(50))],
                           [f"{Path(base).name} -c per call (no sandbox)", us(fresh_lat.p(50)), us(fresh_lat.p(99)),
                            "1.00×"]]))
    s.notes.append("A call without a session also makes and removes its own folder; a session's call does not.")
    return s
