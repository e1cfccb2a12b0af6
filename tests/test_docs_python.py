"""Every runnable example of docs/python.md runs, in a fresh interpreter, and prints what
the guide says it prints (the `# ...` comment after each print, or on the next line)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, base_env

GUIDE = REPO / "docs" / "python.md"


def examples() -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    return [b for b in blocks if "import machina_dispatch" in b]


def expected_output(code: str) -> list[str]:
    """The comments that state what each print shows: on the print's own line, or the
    comment line right after it."""
    lines = code.splitlines()
    out: list[str] = []
    for i, line in enumerate(lines):
        if not line.lstrip().startswith("print("):
            continue
        if "  # " in line:
            out.append(line.split("  # ", 1)[1])
        elif i + 1 < len(lines) and lines[i + 1].startswith("# "):
            out.append(lines[i + 1][2:])
    return out


def test_the_guide_has_examples() -> None:
    assert len(examples()) >= 7


@pytest.mark.parametrize("index", range(len(examples())))
def test_example_runs_as_documented(index: int, tmp_path: Path) -> None:
    code = examples()[index]
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env=base_env({"MACHINA_TOOLHOST_WORKSPACE": str(tmp_path),
                                        "MACHINA_LEASE_LEDGER": str(tmp_path / "ledger")}), timeout=120)
    assert proc.returncode == 0, proc.stderr
    expected = expected_output(code)
    printed = proc.stdout.splitlines()
    if expected:
        assert printed == expected
    else:
        assert printed  # it printed something
