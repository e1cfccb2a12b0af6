"""A container runtime for the container runner's tests: Debian's podman, configured for this
machine in a containers.conf of the test's own, and an image made locally (no registry): a
root filesystem holding the system's Python, the protocol's runner module and the test tools
(tests/containers), imported with `podman import`.
"""
from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).parent / "containers"
# The system's Python (Debian's), whose standard library the image carries.
PYTHON = Path("/usr/bin/python3")
_LEFT_OUT = {"test", "idlelib", "tkinter", "ensurepip", "lib2to3", "site-packages", "dist-packages", "__pycache__"}


def podman() -> str:
    found = shutil.which("podman")
    if found is None:
        pytest.skip("podman is not installed (scripts/install-system-deps.sh --test installs it)")
    return found


def containers_conf(folder: Path) -> Path:
    """Settings podman needs on machines like the CI's: runc (crun refuses cgroups in hybrid
    mode), cgroupfs, and no raised open-file or process limits (not permitted there)."""
    conf = folder / "containers.conf"
    engine = '[engine]\ncgroup_manager = "cgroupfs"\n'
    if shutil.which("runc"):
        engine += 'runtime = "runc"\n'
    conf.write_text("[containers]\ndefault_ulimits = []\n" + engine)
    return conf


def _add_file(tar: tarfile.TarFile, source: Path, name: str) -> None:
    info = tar.gettarinfo(str(source), arcname=name)
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    if info.isfile():
        with source.open("rb") as f:
            tar.addfile(info, f)
    else:
        tar.addfile(info)


def _add_tree(tar: tarfile.TarFile, source: Path, name: str) -> None:
    _add_file(tar, source, name)
    for child in sorted(source.iterdir()):
        if child.name in _LEFT_OUT:
            continue
        if child.is_dir() and not child.is_symlink():
            _add_tree(tar, child, f"{name}/{child.name}")
        else:
            _add_file(tar, child, f"{name}/{child.name}")


def _libraries(program: Path) -> list[Path]:
    out = subprocess.run(["ldd", str(program)], capture_output=True, text=True, check=True).stdout
    return [Path(word) for line in out.splitlines() for word in line.split() if word.startswith("/")]


def root_filesystem() -> bytes:
    """The image's files as a tar: the Python, its libraries and standard library, /app."""
    python = PYTHON.resolve()
    version = python.name  # python3.11
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for folder in ("usr", "usr/bin", "usr/lib", "lib", "lib64", "tmp", "app"):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if folder == "tmp" else 0o755
            tar.addfile(info)
        _add_file(tar, python, f"usr/bin/{version}")
        for alias in ("python3", "python"):
            link = tarfile.TarInfo(f"usr/bin/{alias}")
            link.type, link.linkname = tarfile.SYMTYPE, version
            tar.addfile(link)
        for lib in _libraries(python):
            real = lib.resolve()
            for part in range(1, len(lib.parts) - 1):  # its folders
                folder = "/".join(lib.parts[1:part + 1])
                if folder not in tar.getnames():
                    info = tarfile.TarInfo(folder)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
            _add_file(tar, real, str(lib)[1:])
        _add_tree(tar, Path("/usr/lib") / version, f"usr/lib/{version}")
        _add_tree(tar, HERE / "namel3ss_tools", "app/namel3ss_tools")
        _add_tree(tar, HERE / "tools", "app/tools")
    return buf.getvalue()


def make_image(runtime: str, env: dict[str, str]) -> Iterator[str]:
    """Imports the test image (named by its content) and removes it afterwards."""
    if not PYTHON.exists():
        pytest.skip(f"{PYTHON} is not installed: the test image carries the system's Python")
    rootfs = root_filesystem()
    tag = "localhost/machina-test-python:" + hashlib.sha256(rootfs).hexdigest()[:16]
    subprocess.run([runtime, "import", "--quiet", "--change", "ENV PYTHONPATH=/app", "--change", "WORKDIR /app",
                    "-", tag], input=rootfs, env=env, check=True, capture_output=True, timeout=120)
    try:
        yield tag
    finally:
        subprocess.run([runtime, "rmi", "--force", tag], env=env, capture_output=True, timeout=120)


def runtime_env(conf: Path) -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def our_containers(runtime: str, env: dict[str, str]) -> list[str]:
    """The containers of the host's calls that still exist (running or not)."""
    out = subprocess.run([runtime, "ps", "--all", "--format", "{{.Names}}"], env=env, capture_output=True,
                         text=True, check=True, timeout=60).stdout
    return [n for n in out.split() if n.startswith("machina-call-")]
