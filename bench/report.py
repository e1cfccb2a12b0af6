"""Writes the Markdown report (and results.json) from the scenarios' sections."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .scenarios import Section

# (headline key, what it is, goal text, check) — the goals the project set itself.
GOALS: list[tuple[str, str, str, Callable[[float], bool], Callable[[float], str]]] = [
    ("serve_rps", "--serve echo, file-fed", "≥ 3 M req/s", lambda v: v >= 3e6, lambda v: f"{v / 1e6:.2f} M req/s"),
    ("lockstep_p50_one_cpu_us", "lock-step p50, both on one vCPU (native driver)", "≤ 4 µs", lambda v: v <= 4,
     lambda v: f"{v:.1f} µs"),
    ("inprocess_overhead_us", "in-process overhead per echo call (InProcess.call − core)", "≤ 0.6 µs",
     lambda v: v <= 0.6, lambda v: f"{v:.2f} µs"),
    ("pool_pipelined_cps", "pooled pipelined dispatch from one Python process", "≥ 200 k calls/s",
     lambda v: v >= 200e3, lambda v: f"{v / 1e3:.0f} k calls/s"),
    ("pool_lockstep_p50_us", "pooled lock-step p50 from Python", "≤ 15 µs", lambda v: v <= 15,
     lambda v: f"{v:.1f} µs"),
    ("mcp_sdk_ratio", "lock-step calls/s ÷ MCP Python SDK (its own client)", "≥ 100×", lambda v: v >= 100,
     lambda v: f"{v:.0f}×"),
    ("mcp_raw_ratio", "MCP SDK server p50 ÷ ours, raw lines, native driver, one vCPU", "≥ 100×",
     lambda v: v >= 100, lambda v: f"{v:.0f}×"),
    ("audit_ratio", "echo throughput with the audit store on ÷ off (every call recorded)", "≥ 0.95×",
     lambda v: v >= 0.95, lambda v: f"{v:.2f}×"),
    ("isolation_added_two_cpu_us", "a fresh sandbox per call adds (lock-step p50, two vCPUs)", "≤ 60 µs",
     lambda v: v <= 60, lambda v: f"{v:.1f} µs"),
    ("isolation_two_workers_cps", "a fresh sandbox per call, file-fed, two workers", "≥ 20 k calls/s",
     lambda v: v >= 20e3, lambda v: f"{v / 1e3:.1f} k calls/s"),
    ("run_vs_true", "--run ÷ /bin/true, via subprocess.run", "≤ 1.15×", lambda v: v <= 1.15,
     lambda v: f"{v:.2f}×"),
    ("spawn_api_vs_true", "run_machina_toolhost ÷ /bin/true", "≤ 1.2×", lambda v: v <= 1.2,
     lambda v: f"{v:.2f}×"),
    ("python_lockstep_p50_us", "warm Python tool, lock-step p50 through --serve", "≤ 40 µs", lambda v: v <= 40,
     lambda v: f"{v:.1f} µs"),
    ("python_exec_session_p50_us", "execute_python in a session (a warm interpreter), p50", "≤ 150 µs",
     lambda v: v <= 150, lambda v: f"{v:.0f} µs"),
    ("python_fresh_ratio", "a fresh interpreter per call ÷ a warm Python tool (p50)", "≥ 150×",
     lambda v: v >= 150, lambda v: f"{v:.0f}×"),
    ("python_pipelined_cps", "Python tool pipelined, 2 Python workers", "≥ 40 k calls/s", lambda v: v >= 40e3,
     lambda v: f"{v / 1e3:.1f} k calls/s"),
    ("mcp_front_lockstep_ratio_one_cpu", "--mcp lock-step calls/s ÷ the MCP SDK's server, one vCPU", "≥ 100×",
     lambda v: v >= 100, lambda v: f"{v:.0f}×"),
    ("mcp_front_lockstep_ratio_two_cpu", "--mcp lock-step calls/s ÷ the MCP SDK's server, two vCPUs", "≥ 100×",
     lambda v: v >= 100, lambda v: f"{v:.0f}×"),
    ("mcp_front_lockstep_ratio_polling",
     "--mcp lock-step calls/s ÷ the MCP SDK's server, two vCPUs unpinned, driver polling", "≥ 100×",
     lambda v: v >= 100, lambda v: f"{v:.0f}×"),
    ("mcp_front_pipelined_ratio", "--mcp pipelined calls/s ÷ the MCP SDK's server", "≥ 100×", lambda v: v >= 100,
     lambda v: f"{v:.0f}×"),
    ("skill_runner_added_us", "the skill runner adds per call (lock-step p50, one vCPU)", "≤ 15 µs",
     lambda v: v <= 15, lambda v: f"{v:.1f} µs"),
    ("skill_16x10ms_ms", "16 concurrent calls to a skill sleeping 10 ms, total", "≤ 30 ms", lambda v: v <= 30,
     lambda v: f"{v:.1f} ms"),
    ("nats_native_calls_per_s", "--nats echo, 1 host, native pipelined requester", "≥ 100 k calls/s",
     lambda v: v >= 100e3, lambda v: f"{v / 1e3:.0f} k calls/s"),
    ("nats_native_lockstep_p50_us", "--nats echo lock-step p50, 1 host (beside nats-server alone: NATS section)",
     "≤ 60 µs", lambda v: v <= 60, lambda v: f"{v:.0f} µs"),
    ("nats_python_acall_many_calls_per_s", "md.Nats.acall_many, echo, 1 --nats host", "≥ 50 k calls/s",
     lambda v: v >= 50e3, lambda v: f"{v / 1e3:.0f} k calls/s"),
]


def md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def goals_table(sections: list[Section]) -> str:
    headline: dict[str, float] = {}
    for s in sections:
        headline.update(s.headline)
    rows = []
    for key, what, goal, ok, fmt in GOALS:
        if key in headline:
            v = headline[key]
            rows.append([what, goal, fmt(v), "met" if ok(v) else "**not met**"])
    return md_table(["figure", "goal", "measured", ""], rows) if rows else "(no goal figure in this run)"


def write(out: Path, sections: list[Section], failures: dict[str, str], meta: dict[str, Any]) -> Path:
    lines = [
        "# machina-toolhost benchmark report",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M', time.localtime(meta['started']))}, "
        f"{'quick' if meta['quick'] else 'full'} mode, {meta['elapsed_s']:.0f} s. Command: `{meta['command']}`.",
        "",
        f"Machine: {meta['machine'].get('cpu_model', '?')}, {meta['machine']['cpus']} CPUs usable, "
        f"{meta['machine'].get('memory_gib', '?')} GiB, Linux {meta['machine']['kernel']}, "
        f"Python {meta['machine']['python']}; machina-toolhost {meta['version']}.",
        "",
        "Every comparison is measured side by side in this run; figures are medians over the "
        "repetitions with min–max in brackets. Latency percentiles are nearest-rank over all "
        "round trips. CPU placement is stated where it matters (driver and host pinned with "
        "sched_setaffinity); everything else runs unpinned. On a shared 2-vCPU virtual machine "
        "absolute figures move by tens of percent from run to run; ratios move much less.",
        "",
        "## Goals",
        "",
        goals_table(sections),
        "",
    ]
    if failures:
        lines += ["## Scenarios that failed", ""]
        lines += [f"- `{k}`: {v}" for k, v in failures.items()]
        lines.append("")
    for s in sections:
        lines += [f"## {s.title}", "", s.explain, ""]
        for t in s.tables:
            lines += [f"*{t.caption}*", "", md_table(t.header, t.rows), ""]
        lines += [f"![{p}]({p})" for p in s.plots]
        lines += s.notes
        lines.append("")
    report = out / "report.md"
    report.write_text("\n".join(lines))
    (out / "results.json").write_text(json.dumps({"meta": meta, "failures": failures,
                                                  "sections": [asdict(s) for s in sections]}, indent=1))
    return report
