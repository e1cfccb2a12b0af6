"""Developer checks that must hold on every commit: the C++ builds warning-free with
-Wall -Wextra (-Wpedantic -Wshadow, as errors), the Python package is ruff- and
mypy --strict clean."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, not_sanitized


@not_sanitized
@pytest.mark.timeout(900)  # a full build of the project
def test_cpp_builds_without_warnings(tmp_path: Path) -> None:
    cmake = shutil.which("cmake")
    assert cmake is not None, "cmake comes with the test extras: pip install '.[test]'"
    import pybind11

    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    configure = subprocess.run(
        [cmake, "-S", str(REPO), "-B", str(tmp_path), *gen, "-DMACHINA_WARNINGS_AS_ERRORS=ON",
         "-DCMAKE_BUILD_TYPE=Release", f"-DPython_EXECUTABLE={sys.executable}",
         f"-Dpybind11_DIR={pybind11.get_cmake_dir()}"],
        capture_output=True, text=True,
    )
    assert configure.returncode == 0, configure.stdout + configure.stderr
    build = subprocess.run([cmake, "--build", str(tmp_path), "-j2"], capture_output=True, text=True)
    assert build.returncode == 0, build.stdout[-5000:] + build.stderr[-5000:]
    assert "warning:" not in build.stdout + build.stderr


def test_ruff_clean() -> None:
    ruff = shutil.which("ruff")
    assert ruff is not None, "ruff comes with the test extras: pip install '.[test]'"
    proc = subprocess.run([ruff, "check", "python", "tests", "bench"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_mypy_strict_clean() -> None:
    proc = subprocess.run([sys.executable, "-m", "mypy", "--strict", "python/machina_dispatch"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
