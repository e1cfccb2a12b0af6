"""machina_dispatch: call machina-toolhost tools from Python.

This release exposes the in-process host (:class:`Host`, backed by the compiled
``_core`` module) and the operator's :func:`issue_lease`. The spawn and serve-pool
transports build on the same core.
"""

from __future__ import annotations

from pathlib import Path

from . import _core
from ._core import HostError, Session, issue_lease

__all__ = [
    "Host",
    "HostError",
    "Session",
    "__version__",
    "builtin_plugin_path",
    "get_include",
    "issue_lease",
    "plugin_dir",
]

__version__: str = _core.__version__

# Compiled files (the _core module, the plugin pack, the ABI headers) are installed
# together; in an editable install they live apart from the Python sources.
_PACKAGE_DIR = Path(_core.__file__).resolve().parent


def plugin_dir() -> Path:
    """The folder holding the built-in plugin pack."""
    return _PACKAGE_DIR / "plugins"


def builtin_plugin_path() -> Path:
    """The built-in plugin library, loaded when no plugin is named."""
    return plugin_dir() / _core.BUILTIN_PLUGIN_FILE


def get_include() -> Path:
    """The folder with ``machina/plugin_abi.h`` and ``machina/plugin.hpp`` for plugin authors."""
    return _PACKAGE_DIR / "include"


class Host(_core.Host):
    """The C++ host in this process.

    Args:
        plugins: plugin libraries to load; ``None`` loads the built-in pack.
        **options: caps and limits (``max_request_bytes``, ``max_output_bytes``,
            ``idempotency_ttl_ms``, ``idempotency_max_entries``, ``breaker_threshold``,
            ``breaker_window_ms``, ``breaker_cooldown_ms``).

    Raises:
        HostError: a plugin cannot be loaded (the message names the file), or lease
            enforcement is on (``MACHINA_LEASE_ENFORCE=1``) without a usable secret.
    """

    def __init__(self, plugins: list[str | Path] | None = None, **options: int) -> None:
        super().__init__(**options)
        for path in plugins if plugins is not None else [builtin_plugin_path()]:
            self.load_plugin(str(path))
