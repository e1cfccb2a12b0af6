"""JSON-RPC: the MCP front beside an MCP SDK server, and hosted skills."""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from .._support import ECHO_REQUEST, HERE, env_with, pipelined, rate, ratio, repeat, run_lockstep, us
from ._baselines import MCP_CALL, MCP_INIT, MCP_INITIALIZED, mcp_server
from ._context import Ctx, Section, Table, placements

MCP_CALL_OURS = MCP_CALL.replace('"name":"echo"', '"name":"AID.ECHO.v1"')


SKILL_CALL = ('{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo",'
              '"arguments":{"msg":"hello","n":1}}}')


def mcp_calls_file(ctx: Ctx, name: str, tool: str, n: int, handshake: bool) -> Path:
    """An MCP session in a file: initialize (and initialized), then n calls with distinct ids."""
    path = ctx.work / f"{name}.jsonl"
    with path.open("w") as f:
        f.write(MCP_INIT[2:] + "\n")
        if handshake:
            f.write(MCP_INITIALIZED[2:] + "\n")
        for i in range(n):
            f.write(json.dumps({"jsonrpc": "2.0", "id": i + 10, "method": "tools/call",
                                "params": {"name": tool, "arguments": {"msg": "hello", "n": 1}}},
                               separators=(",", ":")) + "\n")
    return path


def jsonrpc(ctx: Ctx) -> Section:
    import machina_dispatch as md

    s = Section("jsonrpc", "JSON-RPC: the MCP front and hosted skills",
                "MCP: `machina-toolhost --mcp` serving the built-in echo tool against the official MCP Python "
                "SDK's stdio server with one echo tool (bench/baselines/mcp_echo_server.py), both driven by the "
                "same client: lock-step, the native driver (bench/native/lockstep.c) sending raw `tools/call` "
                "lines after the handshake; pipelined, a Python driver writing a file of calls with distinct "
                "ids while it reads the answers, until every call is answered (the time of the handshake "
                "alone taken off). Skills: a C skill that answers at once "
                "(bench/native/echo_skill.c) called directly by the native driver, against the same skill "
                "hosted by `--serve` (a `[[skill]]`); what the runner adds is the hosted round trip less the "
                "direct one less the host's own round trip for an inline echo. Concurrency: 16 calls at once "
                "to one Python skill process whose tool sleeps 10 ms (bench/baselines/sleep_skill.py), from "
                "16 threads through `machina_dispatch.Skill`.")
    driver = ctx.native.lockstep()
    env = env_with()
    n = ctx.n(5_000, 50_000)
    n_sdk = ctx.n(300, 2_000)
    pre = (MCP_INIT, MCP_INITIALIZED)
    rows = []
    for where, dcpu, hcpu in placements(ctx):
        ctx.status(f"MCP lock-step, {where}")
        ours = run_lockstep(driver, [ctx.host, "--mcp"], n, 1000, MCP_CALL_OURS, pre=pre, expect='"isError":false',
                            driver_cpu=dcpu, host_cpu=hcpu)
        inline = run_lockstep(driver, [ctx.host, "--mcp", "--workers", "1"], n, 1000, MCP_CALL_OURS, pre=pre,
                              expect='"isError":false', driver_cpu=dcpu, host_cpu=hcpu)
        sdk = run_lockstep(driver, mcp_server(), n_sdk, 100, MCP_CALL, pre=pre, expect='"isError":false',
                           driver_cpu=dcpu, host_cpu=hcpu, env=env)
        # The floor: a pipe round trip with no work (cat sends the line back; the line names
        # the marker the driver looks for).
        floor = run_lockstep(driver, ["cat"], n, 1000, MCP_CALL_OURS[:-1] + ',"isError":false}',
                             expect='"isError":false', driver_cpu=dcpu, host_cpu=hcpu)
        base = 1e9 / ours.mean
        for name, lat in (("machina-toolhost --mcp", ours), ("machina-toolhost --mcp --workers 1", inline),
                          ("MCP Python SDK, stdio", sdk), ("cat (floor: no work at all)", floor)):
            rows.append([name, where, us(lat.p(50)), us(lat.p(99)), rate(1e9 / lat.mean), ratio(base, 1e9 / lat.mean)])
        key = "one" if dcpu == hcpu else "two"
        s.headline[f"mcp_front_lockstep_ratio_{key}_cpu"] = sdk.mean / ours.mean
        s.notes.append(f"{where}: the most any server could reach here, a pipe round trip with no work (cat), is "
                       f"{sdk.mean / floor.mean:.0f}× the SDK's calls/s; --mcp reaches {sdk.mean / ours.mean:.0f}×.")
    # The same across two vCPUs with a driver that polls for each answer: on this VM a
    # sleeping driver's wake-up alone costs tens of microseconds whoever answers; polling
    # leaves each server's own time (and the pipe's). Neither is pinned, so a server that
    # polls for its next request (--mcp does, for --spin-us, when it may run on two vCPUs)
    # can.
    if len(placements(ctx)) > 1:
        where, dcpu, hcpu = "two vCPUs, not pinned, driver polling", None, None
        ctx.status(f"MCP lock-step, {where}")
        ours = run_lockstep(driver, [ctx.host, "--mcp"], n, 1000, MCP_CALL_OURS, pre=pre, expect='"isError":false',
                            driver_cpu=dcpu, host_cpu=hcpu, poll=True)
        sdk = run_lockstep(driver, mcp_server(), n_sdk, 100, MCP_CALL, pre=pre, expect='"isError":false',
                           driver_cpu=dcpu, host_cpu=hcpu, env=env, poll=True)
        floor = run_lockstep(driver, ["cat"], n, 1000, MCP_CALL_OURS[:-1] + ',"isError":false}',
                             expect='"isError":false', driver_cpu=dcpu, host_cpu=hcpu, poll=True)
        base = 1e9 / ours.mean
        for name, lat in (("machina-toolhost --mcp", ours), ("MCP Python SDK, stdio", sdk),
                          ("cat (floor: no work at all)", floor)):
            rows.append([name, where, us(lat.p(50)), us(lat.p(99)), rate(1e9 / lat.mean), ratio(base, 1e9 / lat.mean)])
        s.headline["mcp_front_lockstep_ratio_polling"] = sdk.mean / ours.mean
        s.notes.append(f"{where}: --mcp reaches {sdk.mean / ours.mean:.0f}× the SDK's calls/s (a pipe round trip "
                       f"with no work, cat: {sdk.mean / floor.mean:.0f}×).")
    s.tables.append(Table(f"Lock-step MCP tools/call round trips ({n:,} each, {n_sdk:,} for the SDK); last "
                          "column: machina-toolhost --mcp calls/s ÷ this row's",
                          ["server", "placement", "p50 µs", "p99 µs", "calls/s", "--mcp ÷ this"], rows))

    # Pipelined: a file of calls.
    n_pipe = ctx.n(50_000, 200_000)
    n_pipe_sdk = ctx.n(1_000, 5_000)
    ours_file = mcp_calls_file(ctx, "mcp-ours", "AID.ECHO.v1", n_pipe, True)
    sdk_file = mcp_calls_file(ctx, "mcp-sdk", "echo", n_pipe_sdk, True)
    ours_start = mcp_calls_file(ctx, "mcp-ours-0", "AID.ECHO.v1", 0, True)
    sdk_start = mcp_calls_file(ctx, "mcp-sdk-0", "echo", 0, True)
    ctx.status("MCP pipelined")
    ours_s = repeat(lambda: pipelined([ctx.host, "--mcp"], ours_file, n_pipe + 1, marker=b'"result"'), ctx.reps).median
    ours_0 = repeat(lambda: pipelined([ctx.host, "--mcp"], ours_start, 1), ctx.reps).median
    sdk_s = repeat(lambda: pipelined(mcp_server(), sdk_file, n_pipe_sdk + 1, env=env, marker=b'"result"'),
                   ctx.reps).median
    sdk_0 = repeat(lambda: pipelined(mcp_server(), sdk_start, 1, env=env), ctx.reps).median
    ours_rate = n_pipe / max(ours_s - ours_0, 1e-9)
    sdk_rate = n_pipe_sdk / max(sdk_s - sdk_0, 1e-9)
    s.headline["mcp_front_pipelined_ratio"] = ours_rate / sdk_rate
    s.tables.append(Table(f"Pipelined MCP tools/call, a file of {n_pipe:,} calls ({n_pipe_sdk:,} for the SDK), "
                          f"median of {ctx.reps}, start-up taken off",
                          ["server", "calls/s", "start-up s", "--mcp ÷ this"],
                          [["machina-toolhost --mcp", rate(ours_rate), f"{ours_0:.3f}", "1.00×"],
                           ["MCP Python SDK, stdio", rate(sdk_rate), f"{sdk_0:.3f}", ratio(ours_rate, sdk_rate)]]))

    # The skill runner's own cost.
    skill = ctx.work / "echo-skill"
    skill.mkdir(exist_ok=True)
    (skill / "manifest.json").write_text(json.dumps({"runtime": {"type": "subprocess",
                                                                 "command": str(ctx.native.echo_skill())}}))
    (skill / "SKILL.md").write_text("---\nname: echo\ndescription: answers its arguments\n---\n")
    hosted_request = json.dumps({"aid": "AID.SKILL.ECHO.ECHO.v1", "input_json": json.dumps({"msg": "hello", "n": 1})})
    srows = []
    # (All on one vCPU, every hop a switch on the same CPU, so that the subtraction is exact:
    # across two, the host and its skill share a CPU the driver does not.)
    for where, dcpu, hcpu in placements(ctx)[:1]:
        ctx.status(f"skill runner, {where}")
        direct = run_lockstep(driver, [str(ctx.native.echo_skill())], n, 1000, SKILL_CALL,
                              expect='"structuredContent"', driver_cpu=dcpu, host_cpu=hcpu)
        hosted = run_lockstep(driver, [ctx.host, "--serve", "--tools", str(skill)], n, 1000, hosted_request,
                              driver_cpu=dcpu, host_cpu=hcpu, env=env_with(XDG_STATE_HOME=str(ctx.work / "state")))
        host_only = run_lockstep(driver, [ctx.host, "--serve"], n, 1000, ECHO_REQUEST, driver_cpu=dcpu, host_cpu=hcpu)
        added = hosted.p(50) - host_only.p(50) - direct.p(50)
        srows.append([where, us(direct.p(50)), us(hosted.p(50)), us(host_only.p(50)), us(added)])
        s.headline["skill_runner_added_us"] = added / 1e3
    s.tables.append(Table(f"Lock-step p50 ({n:,} round trips each); the runner adds hosted − host alone − direct",
                          ["placement", "skill direct µs", "skill via --serve µs", "--serve inline echo µs",
                           "the runner adds µs"], srows))

    # Many calls in flight on one skill.
    ctx.status("16 concurrent calls to a sleeping skill")
    from concurrent.futures import ThreadPoolExecutor

    walls = []
    with md.Skill([sys.executable, "-m", "bench.baselines.sleep_skill"], cwd=HERE.parent,
                  name="sleeper") as t, ThreadPoolExecutor(16) as pool:
        t.call("sleep", {"ms": 1})
        for _ in range(ctx.n(10, 30)):
            t0 = time.perf_counter()
            results = list(pool.map(lambda _: t.call("sleep", {"ms": 10}), range(16)))
            walls.append(time.perf_counter() - t0)
            assert all(r.ok for r in results)
    wall = statistics.median(walls)
    s.headline["skill_16x10ms_ms"] = wall * 1e3
    s.tables.append(Table(f"16 calls at once to one skill whose tool sleeps 10 ms ({len(walls)} rounds)",
                          ["", "median ms", "min ms", "max ms", "if one at a time"],
                          [["all 16 answered", f"{wall * 1e3:.1f}", f"{min(walls) * 1e3:.1f}",
                            f"{max(walls) * 1e3:.1f}", "≥ 160"]]))
    return s
