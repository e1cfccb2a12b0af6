"""install_python_package runs no installed package's code (security issue 32, item 7): pip
runs with the network open, so a `.pth` file an earlier install put into the workspace's
environment must not run while a later install does; and a requirement is a PEP 508 name
with extras made of names, never a file name pip would read as a path, nor an option
hidden in its extras. Wheels are built here; nothing reaches the network."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from python_support import make_wheel
from test_python_exec import EXECUTE, INSTALL, LIST, Py, output, refused, request


@pytest.fixture
def py(tmp_path: Path, no_orphans: None) -> Py:
    return Py(tmp_path)


@pytest.fixture(scope="module")
def confined(tmp_path_factory: pytest.TempPathFactory) -> None:
    from conftest import skip_where_unconfinable

    probe = Py(tmp_path_factory.mktemp("probe"))
    r = probe.call(EXECUTE, code="1")
    skip_where_unconfinable([r])
    assert output(r)["result"] == 1, r


def test_a_pth_file_in_the_environment_does_not_run_during_a_later_install(py: Py, confined: None,
                                                                           tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    # A .pth line starting with "import" runs at every start of an interpreter that
    # processes the environment's site-packages; this one leaves a marker in the
    # environment (which pip may write, and the code's interpreters may not).
    hook = ("import sys, pathlib; exec(\"try:\\n pathlib.Path(sys.prefix, 'PTH-RAN').write_text('ran')\\n"
            "except OSError:\\n pass\")\n")
    make_wheel(wheels, "pthhook", "1.0", {"pthhook.pth": hook, "pthhook/__init__.py": ""})
    make_wheel(wheels, "tinypkg", "1.0", {"tinypkg/__init__.py": "VALUE = 42\n"})
    py.settings.update(find_links=[str(wheels)], no_index=True)
    with py.host() as h:
        first = output(h.call(INSTALL, package="pthhook"))
        assert first["success"] is True and first["installed"] == [{"name": "pthhook", "version": "1.0"}], first
        assert not list(py.pyws.rglob("PTH-RAN"))
        second = output(h.call(INSTALL, package="tinypkg"))
        assert second["success"] is True and second["installed"] == [{"name": "tinypkg", "version": "1.0"}], second
        assert not list(py.pyws.rglob("PTH-RAN")), "the .pth file ran while pip installed tinypkg"
        # Installs still see what is installed, and the code still imports it.
        again = output(h.call(INSTALL, package="tinypkg"))
        assert again["success"] is True and again["already_installed"] is True, again
        assert output(h.call(EXECUTE, code="import tinypkg\ntinypkg.VALUE"))["result"] == 42


@pytest.mark.parametrize(
    ("spec", "contains"),
    [
        ("x.whl", "is not a package name"),
        ("tinypkg-1.0-py3-none-any.whl", "is not a package name"),
        ("x.tar.gz", "is not a package name"),
        ("x.zip", "is not a package name"),
        ("x[--index-url]", "is not a package name"),
        ("x[-e]", "is not a package name"),
        ("x[a,,b]", "is not a package name"),
        ("x[a b]", "is not a package name"),
        ("x[]", "is not a package name"),
    ],
)
def test_file_names_and_options_in_extras_are_refused(py: Py, confined: None, tmp_path: Path, spec: str,
                                                       contains: str) -> None:
    py.settings.update(find_links=[str(tmp_path)], no_index=True)
    r = py.serve(request(INSTALL, package=spec), request(EXECUTE, code="1", install_packages=[spec]), request(LIST))
    refused(r[0], "invalid_input", contains)
    refused(r[1], "invalid_input", contains)
    assert not [p for p in output(r[2])["packages"] if p["installed"]]


@pytest.mark.parametrize("spec", ["tinypkg[extra]", "tinypkg[a, b_c]", "tinypkg [x-y.z] >= 1.0", "tiny.pkg"])
def test_names_with_extras_made_of_names_pass_the_check(py: Py, confined: None, tmp_path: Path, spec: str) -> None:
    py.settings.update(find_links=[str(tmp_path)], no_index=True)
    o: Any = output(py.call(INSTALL, package=spec))
    # (no such wheel here: pip itself says so, which means the check let it through)
    assert o["success"] is False and "No matching distribution" in o["error"], o
