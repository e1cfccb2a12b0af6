"""Finding the ``machina-toolhost`` executable."""

from __future__ import annotations

import os
import shutil
import sysconfig
from pathlib import Path

__all__ = ["find_executable"]


def find_executable(explicit: str | os.PathLike[str] | None = None) -> str | None:
    """The executable to run: ``explicit``, else ``$MACHINA_TOOLHOST_BIN``, else the one
    installed with this package (the interpreter's scripts folder), else ``PATH``.
    ``None`` if none exists. (The scripts folder comes before ``PATH`` because version
    managers put shell shims on ``PATH``, which cost a shell start per call.)"""
    if explicit is not None:
        path = os.fspath(explicit)
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    env = os.environ.get("MACHINA_TOOLHOST_BIN")
    if env:
        return env if os.path.isfile(env) and os.access(env, os.X_OK) else None
    for scheme_dir in (sysconfig.get_path("scripts"), sysconfig.get_path("scripts", f"{os.name}_user")):
        if scheme_dir:
            candidate = Path(scheme_dir) / "machina-toolhost"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    return shutil.which("machina-toolhost")
