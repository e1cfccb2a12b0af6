"""The benchmarks run: `python -m bench --quick` produces a complete report with every
scenario, its plots and its figures, and the pytest-benchmark micro-suite passes once
through. Timings are not checked here (machines are noisy); see bench/ and the README."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, not_sanitized

pytestmark = not_sanitized

SCENARIOS = ["serve", "lockstep", "python", "spawn", "inprocess", "workers", "idempotency", "audit", "payload",
             "tools", "ds_state", "isolation", "python_tools", "jsonrpc", "packs", "python_exec", "nats", "nats_native"]
PLOTS = ["serve_throughput.png", "lockstep_cdf.png", "pool_pipelined.png", "workers_scaling.png", "payload.png",
         "tools.png", "ds_state.png"]


@pytest.mark.timeout(600)
def test_quick_benchmark_writes_a_complete_report(tmp_path: Path) -> None:
    # As the README runs it: the default, relative results folder (here beneath tmp_path).
    out = tmp_path / "bench-results"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "bench", "--quick", "--no-progress"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=580)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["failures"] == {}
    assert [s["key"] for s in results["sections"]] == SCENARIOS
    report = (out / "report.md").read_text()
    for s in results["sections"]:
        assert f"## {s['title']}" in report
        assert s["tables"] and all(t["rows"] for t in s["tables"]), s["key"]
    for png in PLOTS:
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
        assert f"]({png})" in report
    headline = {k: v for s in results["sections"] for k, v in s["headline"].items()}
    for key in ["serve_rps", "lockstep_p50_one_cpu_us", "inprocess_overhead_us", "pool_pipelined_cps",
                "mcp_sdk_ratio", "unique_keys_ratio", "ignored_field_ratio",
                "audit_ratio", "audit_ratio_new_inputs", "isolation_added_one_cpu_us", "isolation_two_workers_cps",
                "run_vs_true",
                "python_lockstep_p50_us", "python_fresh_ratio", "python_pipelined_cps",
                "mcp_front_lockstep_ratio_one_cpu", "mcp_front_lockstep_ratio_polling", "mcp_front_pipelined_ratio",
                "skill_runner_added_us",
                "skill_16x10ms_ms", "pack_read_serve_p50_us", "pack_read_inprocess_us", "grep_vs_grep_rn_ratio",
                "code_search_first_ms", "code_search_warm_ms",
                "python_exec_p50_us", "python_exec_session_p50_us", "python_exec_fresh_ratio",
                "nats_1_calls_per_s", "nats_1_p50_us", "nats_broker_cost_us"]:
        assert headline[key] > 0, key
    assert "## Goals" in report and "| --serve echo, file-fed | ≥ 3 M req/s |" in report


def test_list_names_every_scenario_and_its_module() -> None:
    proc = subprocess.run([sys.executable, "-m", "bench", "--list"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    listed = [line.split("\t") for line in proc.stdout.splitlines()]
    assert [name for name, _ in listed] == SCENARIOS
    assert {module for _, module in listed} == {f"bench.scenarios.{family}" for family in (
        "serve", "clients", "rules", "isolation", "python", "jsonrpc", "packs", "nats")}


@pytest.mark.timeout(300)
def test_micro_benchmarks_pass_once() -> None:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "bench/micro",
                           "--benchmark-disable"], cwd=REPO, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "8 passed" in proc.stdout
