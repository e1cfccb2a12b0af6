"""The in-process transport: the C++ host inside this Python process (``_core``), no
process boundary. The GIL is released while a tool runs, so several threads call at
once. Fastest; but an inline tool that crashes takes Python down, and one that hangs
holds the calling thread until it returns (the answer is then ``timeout``) — use
``isolation="process"`` for tools you do not trust.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import _core
from ._arguments import check_list_argument, fspaths
from ._errors import ExecutableNotFound
from ._locate import find_worker_executable, not_found_message
from ._result import ToolResult
from ._transport import Transport, apply_state, input_text, state_text, timeout_ms

__all__ = ["InProcess", "builtin_plugin_path"]

_PACKAGE_DIR = Path(_core.__file__).resolve().parent


def builtin_plugin_path() -> Path:
    """The built-in plugin library, loaded when no plugin is named."""
    return _PACKAGE_DIR / "plugins" / _core.BUILTIN_PLUGIN_FILE


class InProcess(Transport):
    """Calls tools on a :class:`machina_dispatch.Host` in this process.

    Args:
        plugins: plugin libraries to load; ``None`` loads the built-in plugin.
        packs: the built-in tool packs to serve (``"files"``, ``"shell"``, ``"code"``,
            ``"python"``; docs/tool-packs.md); ``None``: all of them when no plugin is named,
            else none.
        policy: the tool packs' policy file (TOML); ``None``: ``$MACHINA_TOOLHOST_POLICY``,
            else safe defaults.
        tools: TOML tool manifests whose tools to load too (Python tools, HTTP tool services;
            docs/python-tools.md).
        isolation: ``"inline"`` (tools run on the calling thread) or ``"process"`` (in
            supervised worker processes of the ``machina-toolhost`` executable).
        executable: the executable for ``isolation="process"`` (found as usual otherwise).
        timeout: default deadline in seconds (see :mod:`machina_dispatch._transport`).
        **options: host options, as :class:`machina_dispatch.Host` takes them.

    Raises:
        HostError: a plugin or a tool manifest cannot be loaded, or a host option is invalid.
        ExecutableNotFound: ``isolation="process"`` without a ``machina-toolhost`` executable.
    """

    def __init__(self, plugins: Sequence[str | os.PathLike[str]] | None = None, *,
                 tools: Sequence[str | os.PathLike[str]] | None = None, isolation: str = "inline",
                 packs: list[str] | None = None, policy: str | os.PathLike[str] | None = None,
                 executable: str | os.PathLike[str] | None = None, timeout: float | None = None,
                 **options: Any) -> None:
        super().__init__(timeout)
        check_list_argument("plugins", plugins)
        check_list_argument("tools", tools)
        check_list_argument("packs", packs)
        if isolation == "process" or "worker_executable" not in options:
            # Without a launcher, sandboxed Python tools and shell.exec's commands are refused
            # (guarantee_blocked), never run unconfined.
            found = find_worker_executable(executable, isolation, bool(tools or packs or plugins is None))
            if found is not None:
                options["worker_executable"] = found
            elif isolation == "process":
                raise ExecutableNotFound(ToolResult.failure("", "not_found", not_found_message(executable)))
        self.host = _core.Host(isolation=isolation, **options)
        self.host.load_default_tools(plugins=fspaths(plugins),
                                     packs=packs, policy=None if policy is None else os.fspath(policy),
                                     tools=[os.fspath(p) for p in tools or []],
                                     builtin_plugin=os.fspath(builtin_plugin_path()))
        # The transport's life is a session of the hosted skills' (lifecycle/onSessionStart).
        self._session: str | None = None
        if tools:
            self._session = f"python-{os.getpid()}-{id(self):x}"
            self.host.session_started(self._session)
        # What the compiled call needs; None once closed.
        self._fast: _core.InProcessState | None = _core.InProcessState(
            host=self.host, default_timeout_ms=timeout_ms(self.timeout), input_text=input_text,
            state_text=state_text, apply_state=apply_state, timeout_ms=timeout_ms)

    # call(aid, inputs=None, *, state=None, idempotency_key=None, lease_token=None,
    # timeout=None, check=True, user=None): Transport.call, compiled in _core — a Python method cost
    # as much as the call itself.
    call = _core._inprocess_call

    def close(self) -> None:
        """Ends the host's isolated worker processes, Python workers, skills and MCP servers,
        and writes out its audit store; later calls raise RuntimeError."""
        self._fast = None
        session, self._session = getattr(self, "_session", None), None
        if session is not None:
            self.host.session_ended(session)
        self.host.close()

    def stats(self) -> dict[str, int]:
        """The host's counters (see :meth:`machina_dispatch.Host.stats`)."""
        return self.host.stats()

