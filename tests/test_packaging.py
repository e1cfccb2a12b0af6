"""Packaging: an editable install works (executable, plugins and _core found from the
build) and `pip install -e .` again rebuilds what changed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, not_sanitized

IGNORE = shutil.ignore_patterns("build", ".git", "__pycache__", "*.so", ".pytest_cache", ".mypy_cache",
                                ".ruff_cache", "*.egg-info")


@not_sanitized
@pytest.mark.timeout(900)  # two builds of the whole project
def test_editable_install_rebuilds_on_change(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=IGNORE)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-e", str(src)]
    exe = venv / "bin" / "machina-toolhost"

    def description(*args: str) -> str:
        out = subprocess.run([str(exe), *args, "--list"], capture_output=True, check=True).stdout
        return str({t["aid"]: t for t in json.loads(out)["tools"]}["AID.ECHO.v1"]["description"])

    def pack_description() -> str:
        """Through the package's plugin pack: the static executable hands over to the
        plugin-loading build installed in this venv's package."""
        pack = subprocess.run([str(venv / "bin" / "python"), "-c",
                               "import machina_dispatch as m; print(m.builtin_plugin_path())"],
                              capture_output=True, text=True, check=True).stdout.strip()
        return description("--plugin", pack)

    subprocess.run(pip, check=True, capture_output=True)
    assert description() == "Returns its input unchanged."
    assert pack_description() == "Returns its input unchanged."
    core = subprocess.run([str(venv / "bin" / "python"), "-c",
                           "import machina_dispatch as m; h = m.Host(); s = m.Session();"
                           "print(h.call_json('{\"aid\":\"AID.ECHO.v1\",\"input_json\":\"7\"}', s))"],
                          capture_output=True, text=True, check=True)
    assert json.loads(core.stdout)["output_json"] == "7"

    tools = src / "plugins" / "builtin" / "builtin_tools.cpp"
    tools.write_text(tools.read_text().replace("Returns its input unchanged.", "Returns its input, rebuilt."))
    subprocess.run(pip, check=True, capture_output=True)
    assert description() == "Returns its input, rebuilt."
    assert pack_description() == "Returns its input, rebuilt."
