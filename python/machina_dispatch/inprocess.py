"""The in-process transport: the C++ host inside this Python process (``_core``), no
process boundary. The GIL is released while a tool runs, so several threads call at
once. Fastest; but an inline tool that crashes takes Python down, and one that hangs
holds the calling thread until it returns (the answer is then ``timeout``) — use
``isolation="process"`` for tools you do not trust.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import _core
from ._inputs import to_input_json
from ._locate import find_executable
from ._result import ToolResult
from ._transport import Transport, apply_state, timeout_ms
from .ds_state import DsState

__all__ = ["InProcess", "builtin_plugin_path"]

_fast_call = _core.call

_PACKAGE_DIR = Path(_core.__file__).resolve().parent


def builtin_plugin_path() -> Path:
    """The built-in plugin library, loaded when no plugin is named."""
    return _PACKAGE_DIR / "plugins" / _core.BUILTIN_PLUGIN_FILE


class InProcess(Transport):
    """Calls tools on a :class:`machina_dispatch.Host` in this process.

    Args:
        plugins: plugin libraries to load; ``None`` loads the built-in pack.
        isolation: ``"inline"`` (tools run on the calling thread) or ``"process"`` (in
            supervised worker processes of the ``machina-toolhost`` executable).
        executable: the executable for ``isolation="process"`` (found as usual otherwise).
        timeout: default deadline in seconds (see :mod:`machina_dispatch._transport`).
        **options: host options, as :class:`machina_dispatch.Host` takes them.

    Raises:
        HostError: a plugin cannot be loaded, or a host option is invalid.
        ExecutableNotFound: ``isolation="process"`` without a ``machina-toolhost`` executable.
    """

    def __init__(self, plugins: list[str | os.PathLike[str]] | None = None, *, isolation: str = "inline",
                 executable: str | os.PathLike[str] | None = None, timeout: float | None = None,
                 **options: Any) -> None:
        super().__init__(timeout)
        if isolation == "process":
            found = find_executable(executable, loads_plugins=True)  # workers load plugins by path
            if found is None:
                from ._errors import ExecutableNotFound

                raise ExecutableNotFound(ToolResult.failure("", "not_found", "machina-toolhost executable not found"))
            options["worker_executable"] = found
        self.host = _core.Host(isolation=isolation, **options)
        for path in plugins if plugins is not None else [builtin_plugin_path()]:
            self.host.load_plugin(os.fspath(path))
        self._default_ms = timeout_ms(self.timeout)
        # What the compiled call needs; None once closed.
        self._fast: tuple[_core.Host, int, Callable[[Any], str]] | None = (self.host, self._default_ms, to_input_json)

    def call(self, aid: str, inputs: Any = None, *, state: DsState | None = None,
             idempotency_key: str | None = None, lease_token: str | None = None,
             timeout: float | None = None, check: bool = True) -> ToolResult:
        """See :meth:`Transport.call`.

        Raises:
            ToolhostError: with ``check``, the subclass for the failure's kind.
        """
        if self._fast is None:
            raise RuntimeError("the InProcess transport is closed")
        input_json = inputs if type(inputs) is str else to_input_json(inputs)
        ms = self._default_ms if timeout is None else timeout_ms(timeout)
        # A session of its own: a state is sent whole and nothing else shares it.
        r: ToolResult = _fast_call(self.host, aid, input_json, _core.Session(True), idempotency_key, lease_token, ms,
                                   None if state is None else state.to_json())
        apply_state(state, r)
        if check and not r.ok:
            r.raise_for_error()
        return r

    # The reference method. `call` is replaced below by the same method compiled in _core
    # for calls without a state or a timeout of their own, which hands those to this one:
    # a Python method cost as much as the call itself.
    _call_py = call

    def close(self) -> None:
        """Ends the host's isolated worker processes; later calls raise RuntimeError."""
        self._fast = None
        self.host.close()

    def stats(self) -> dict[str, int]:
        """The host's counters (see :meth:`machina_dispatch.Host.stats`)."""
        return self.host.stats()


InProcess.call = _core._inprocess_call  # type: ignore[method-assign]
