"""Finding the ``machina-toolhost`` executable."""

from __future__ import annotations

import os
import shutil
import sysconfig
import threading
from collections.abc import Sequence
from pathlib import Path

__all__ = ["check_setup", "find_executable", "find_executable_for_plugins", "find_worker_executable",
           "not_found_message"]

NOT_FOUND = "machina-toolhost executable not found (pip install machina-toolhost, or set MACHINA_TOOLHOST_BIN)"


def not_found_message(explicit: str | os.PathLike[str] | None = None) -> str:
    """Why :func:`find_executable` found nothing, naming the path it was given, if any."""
    if explicit is not None:
        return f"executable={os.fspath(explicit)!r} is not an executable file (name the machina-toolhost to run)"
    env = os.environ.get("MACHINA_TOOLHOST_BIN")
    if env:
        return f"MACHINA_TOOLHOST_BIN={env!r} is not an executable file (name the machina-toolhost to run)"
    return NOT_FOUND

_checked: set[tuple[str, tuple[str, ...], tuple[tuple[str, str], ...] | None]] = set()
_checked_lock = threading.Lock()
SETUP_CHECK_TIMEOUT_S = 30.0
MAX_LIST_BYTES = 16 * 1024 * 1024  # what --list may print (its output is not kept)
MAX_CHECKED_SETUPS = 256  # set-ups remembered as good; beyond that the memory starts again


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


def find_executable_for_plugins(explicit: str | os.PathLike[str] | None,
                                plugins: Sequence[str | os.PathLike[str]] | None) -> str | None:
    """find_executable for a host started with ``plugins`` (``None``: the built-in tools):
    the plugin-loading build when they are libraries to load, by the core's one rule."""
    from . import _core
    from ._arguments import fspaths

    return find_executable(explicit, loads_plugins=_core.loads_plugin_libraries(fspaths(plugins)))


def find_worker_executable(explicit: str | os.PathLike[str] | None, isolation: str, launches: bool) -> str | None:
    """The executable an in-process host starts: its isolated workers (``isolation="process"``:
    they load plugins by path) or, with ``launches`` (packs or Python tools loaded), the launcher
    of shell.exec's commands and sandboxed tools; ``None`` when there is none or none is needed."""
    if isolation == "process":
        return find_executable(explicit, loads_plugins=True)
    return find_executable(explicit) if launches else None


def check_setup(executable: str, args: list[str], env: dict[str, str] | None) -> None:
    """Makes sure a host started as ``executable *args`` can start at all — its flags are
    known, its plugins load, lease enforcement has a secret — by having it list its tools
    (``--list`` with the same options), so that a transport with a bad set-up fails where
    it is made, not at its first call. Each set-up is checked once per process.

    Raises:
        HostError: the host refused the set-up (its own message).
    """
    key = (executable, tuple(args), None if env is None else tuple(sorted(env.items())))
    with _checked_lock:
        if key in _checked:
            return
    from ._errors import HostError
    from ._process import run_once

    try:
        run = run_once([executable, *args, "--list"], env, b"", SETUP_CHECK_TIMEOUT_S, MAX_LIST_BYTES)
    except OSError as e:
        raise HostError(f"machina-toolhost cannot be started as configured: {e}") from e
    if run.ended != "exited":
        raise HostError(f"machina-toolhost could not list its tools ({run.ended.replace('_', ' ')}): {run.how}")
    if run.exit_code != 0:
        raise HostError(f"machina-toolhost refused its set-up ({run.how}): {run.stderr_tail.strip()}")
    with _checked_lock:
        if len(_checked) >= MAX_CHECKED_SETUPS:
            _checked.clear()
        _checked.add(key)
