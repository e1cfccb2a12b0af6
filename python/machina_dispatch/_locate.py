"""Finding the ``machina-toolhost`` executable."""

from __future__ import annotations

import os
import shutil
import sysconfig
from pathlib import Path

__all__ = ["find_executable"]


def find_executable(explicit: str | os.PathLike[str] | None = None, *, loads_plugins: bool = False) -> str | None:
    """The executable to run: ``explicit``, else ``$MACHINA_TOOLHOST_BIN``, else the one
    installed with this package (the interpreter's scripts folder), else ``PATH``.
    ``None`` if none exists. (The scripts folder comes before ``PATH`` because version
    managers put shell shims on ``PATH``, which cost a shell start per call.)

    With ``loads_plugins`` (plugin libraries will be named) the package's plugin-loading
    build ``libexec/machina-toolhost`` comes before the scripts folder: the static
    executable there would only hand over to it (docs/operations.md)."""
    if explicit is not None:
        path = os.fspath(explicit)
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    env = os.environ.get("MACHINA_TOOLHOST_BIN")
    if env:
        return env if os.path.isfile(env) and os.access(env, os.X_OK) else None
    if loads_plugins:
        from . import _core

        loader = Path(_core.__file__).resolve().parent / "libexec" / "machina-toolhost"
        if loader.is_file() and os.access(loader, os.X_OK):
            return str(loader)
    for scheme_dir in (sysconfig.get_path("scripts"), sysconfig.get_path("scripts", f"{os.name}_user")):
        if scheme_dir:
            candidate = Path(scheme_dir) / "machina-toolhost"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    return shutil.which("machina-toolhost")
