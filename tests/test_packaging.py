"""Packaging: an editable install works (executable, plugins and _core found from the
build) and `pip install --no-build-isolation -e .` again rebuilds what changed, and only
that (pip's isolated build would start over: scikit-build-core clears the build folder's
CMake files for every new temporary build environment); a wheel carries no test hooks."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import REPO, not_sanitized

IGNORE = shutil.ignore_patterns("build", ".git", "__pycache__", "*.so", ".pytest_cache", ".mypy_cache",
                                ".ruff_cache", "*.egg-info")


@not_sanitized
@pytest.mark.rebuild
@pytest.mark.timeout(900)  # a build of the whole project, then a small one
def test_editable_install_rebuilds_on_change(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=IGNORE)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    # What the build needs, in the venv itself (as docs/development.md says to do).
    table = re.search(r"\[build-system\]\s*requires = \[(.*?)\]", (src / "pyproject.toml").read_text(), re.S)
    assert table is not None
    requires = re.findall(r'"([^"]+)"', table.group(1))
    assert any(r.startswith("scikit-build-core") for r in requires), requires
    subprocess.run([python, "-m", "pip", "install", "-q", *requires, "cmake>=3.18", "ninja"], check=True,
                   capture_output=True)
    pip = [python, "-m", "pip", "install", "-v", "--no-build-isolation", "-e", str(src)]
    exe = venv / "bin" / "machina-toolhost"

    def compiled(log: str) -> list[str]:
        """The C++ files the build compiled, from ninja's lines in pip's verbose log."""
        return re.findall(r"Building CXX object \S+/([\w.]+\.cpp)\.o", log)

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

    first = subprocess.run(pip, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
    assert len(compiled(first)) > 30
    assert description() == "Returns its input unchanged."
    assert pack_description() == "Returns its input unchanged."
    core = subprocess.run([str(venv / "bin" / "python"), "-c",
                           "import machina_dispatch as m; h = m.Host(); s = m.Session();"
                           "print(h.call_json('{\"aid\":\"AID.ECHO.v1\",\"input_json\":\"7\"}', s))"],
                          capture_output=True, text=True, check=True)
    assert json.loads(core.stdout)["output_json"] == "7"

    tools = src / "plugins" / "builtin" / "builtin_tools.cpp"
    tools.write_text(tools.read_text().replace("Returns its input unchanged.", "Returns its input, rebuilt."))
    again = subprocess.run(pip, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
    # The changed file and nothing else (it goes into the executable and the plugin pack).
    assert set(compiled(again)) == {"builtin_tools.cpp"}, compiled(again)
    assert description() == "Returns its input, rebuilt."
    assert pack_description() == "Returns its input, rebuilt."


@not_sanitized
@pytest.mark.rebuild
@pytest.mark.timeout(900)  # a build of the whole project
def test_wheel_holds_no_testing_hooks(tmp_path: Path) -> None:
    """A wheel built as users build it carries _core but not the _testing module (test and
    benchmark hooks: MACHINA_TESTING_HOOKS, off unless scripts/install.sh asks for it) nor its stub."""
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=IGNORE)
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist),
                    str(src)], check=True, capture_output=True)
    (wheel,) = dist.glob("machina_toolhost-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("machina_dispatch/_core.") for n in names), names
    assert [n for n in names if n.rsplit("/", 1)[-1].startswith("_testing")] == []
