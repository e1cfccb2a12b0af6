"""A tool manifest's deadlines: a Python tool's is 10 s unless it names its own (tool
protocol v1's default), and a [defaults] table gives the file's tools one of its own."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import TOOLHOST, base_env


def timeouts(tmp_path: Path, manifest: str) -> dict[str, int]:
    path = tmp_path / "tools.toml"
    path.write_text(manifest)
    r = subprocess.run([TOOLHOST, "--tools", str(path), "--packs", "none", "--list"], capture_output=True, text=True,
                       env=base_env(), timeout=30)
    assert r.returncode == 0, r.stderr
    return {t["aid"]: t["timeout_ms"] for t in json.loads(r.stdout)["tools"] if t["aid"].startswith("X.")}


def tool(aid: str, extra: str = "", runner: str = 'runner = "python"\nentry = "m:f"') -> str:
    return f'[[tool]]\naid = "{aid}"\n{runner}\n{extra}\n'


def test_a_python_tool_waits_ten_seconds_unless_told_otherwise(tmp_path: Path) -> None:
    service = 'runner = "service"\nurl = "http://127.0.0.1:9/"'
    got = timeouts(tmp_path, tool("X.A.v1") + tool("X.B.v1", "timeout_ms = 2500") + tool("X.S.v1", runner=service))
    assert got == {"X.A.v1": 10_000, "X.B.v1": 2_500, "X.S.v1": 30_000}


def test_the_files_defaults_apply_to_its_tools_without_their_own(tmp_path: Path) -> None:
    defaults = "[defaults]\ntimeout_seconds = 2.5\n"
    got = timeouts(tmp_path, defaults + tool("X.A.v1") + tool("X.B.v1", "timeout_ms = 7"))
    assert got == {"X.A.v1": 2_500, "X.B.v1": 7}


def test_bad_defaults_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "tools.toml"
    cases = [("[defaults]\ntimeout_ms = 0\n", "[defaults]: field 'timeout_ms': must be from 1 ms to 24 hours"),
             ("[defaults]\ntimout_ms = 5\n", "[defaults]: unknown field 'timout_ms' (did you mean 'timeout_ms'?)"),
             ("defaults = 3\n", "'defaults' must be a table ([defaults])")]
    for text, why in cases:
        path.write_text(text + tool("X.A.v1"))
        r = subprocess.run([TOOLHOST, "--tools", str(path), "--list"], capture_output=True, text=True, env=base_env(),
                           timeout=30)
        assert r.returncode != 0 and why in r.stderr, r.stderr
