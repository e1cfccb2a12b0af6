"""Developer checks that must hold on every commit: the C++ builds warning-free with
-Wall -Wextra (-Wpedantic -Wshadow, as errors), its unit tests (tests/unit) pass under
ctest, the sources are clang-formatted, the Python package, its tests and the benchmarks are
ruff- and mypy --strict clean."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, not_sanitized


@pytest.fixture(scope="module")
def strict_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """A whole build of the project by the `strict` preset (CMakePresets.json): warnings as errors,
    the C++ unit tests included, at -O1 without link-time optimisation. The optimiser's flow
    analysis that some warnings need runs at -O1 already, and `pip install` compiles with the
    same warnings at -O3."""
    cmake = shutil.which("cmake")
    assert cmake is not None, "cmake comes with the test extras: pip install '.[test]'"
    import pybind11

    out = tmp_path_factory.mktemp("strict-build")
    configure = subprocess.run(
        [cmake, "--preset", "strict", "-B", str(out), f"-DPython_EXECUTABLE={sys.executable}",
         f"-Dpybind11_DIR={pybind11.get_cmake_dir()}"],
        cwd=REPO, capture_output=True, text=True,
    )
    assert configure.returncode == 0, configure.stdout + configure.stderr
    return out, subprocess.run([cmake, "--build", str(out), "-j2"], capture_output=True, text=True)


@not_sanitized
@pytest.mark.rebuild
@pytest.mark.timeout(900)  # a full build of the project
def test_cpp_builds_without_warnings(strict_build: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    _, build = strict_build
    assert build.returncode == 0, build.stdout[-5000:] + build.stderr[-5000:]
    assert "warning:" not in build.stdout + build.stderr


@not_sanitized
@pytest.mark.rebuild
@pytest.mark.timeout(900)
def test_cpp_unit_tests_pass(strict_build: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    """tests/unit (a file per core component), run by ctest as a developer would."""
    out, build = strict_build
    assert build.returncode == 0, build.stdout[-5000:] + build.stderr[-5000:]
    ctest = shutil.which("ctest")
    assert ctest is not None, "ctest comes with cmake"
    proc = subprocess.run([ctest, "--test-dir", str(out), "--output-on-failure", "-j2"], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-2000:]
    assert "100% tests passed" in proc.stdout and " 0 tests" not in proc.stdout, proc.stdout[-2000:]
    # One ctest test per test case: a name ctest splits would run no case and still pass.
    count = subprocess.run([str(out / "machina_unit_tests"), "--count"], capture_output=True, text=True, timeout=60)
    cases = re.search(r"passing the current filters: (\d+)", count.stdout)
    ran = re.search(r"tests passed(?:, \d+ tests failed)? out of (\d+)", proc.stdout)
    assert cases and ran and cases.group(1) == ran.group(1), (count.stdout, proc.stdout[-500:])


def test_unit_test_names_are_single_ctest_names() -> None:
    """doctest_discover_tests registers each test case under its name, which CMake would cut
    at a ';' (its list separator) into names that match no case: such a case never runs."""
    cut = [f"{path.name}: {m.group(1)}" for path in sorted((REPO / "tests" / "unit").glob("*.cpp"))
           for m in re.finditer(r'TEST_CASE\("((?:[^"\\]|\\.)*)"', path.read_text()) if ";" in m.group(1)]
    assert not cut, cut


# Every C and C++ source the repository tracks, formatted by the pinned clang-format with the repository's
# .clang-format.
CPP_SOURCES = ("*.c", "*.cc", "*.cpp", "*.h", "*.hpp")


def test_cpp_is_clang_formatted() -> None:
    clang_format = shutil.which("clang-format", path=str(Path(sys.executable).parent)) or shutil.which("clang-format")
    assert clang_format is not None, "clang-format comes with the test extras: pip install '.[test]'"
    files = subprocess.run(["git", "ls-files", "-z", "--", *CPP_SOURCES], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.split("\0")
    files = [f for f in files if f and (REPO / f).is_file()]
    assert len(files) > 100, files
    proc = subprocess.run([clang_format, "--dry-run", "--Werror", *files], cwd=REPO, capture_output=True, text=True)
    offending = sorted({line.split(":", 1)[0] for line in proc.stderr.splitlines() if ": error:" in line})
    assert proc.returncode == 0 and not offending, (
        f"{len(offending)} files differ from clang-format's output (fix: clang-format -i FILE): "
        + " ".join(offending[:40]) + "\n" + proc.stderr[:3000])


def test_ruff_clean() -> None:
    ruff = shutil.which("ruff")
    assert ruff is not None, "ruff comes with the test extras: pip install '.[test]'"
    proc = subprocess.run([ruff, "check", "python", "tests", "bench"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_mypy_strict_clean() -> None:
    proc = subprocess.run([sys.executable, "-m", "mypy", "--strict", "python/machina_dispatch", "tests", "bench"],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
