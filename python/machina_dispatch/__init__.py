"""machina_dispatch: call machina-toolhost tools from Python.

Four transports, one API (``call``, ``acall``, ``call_many``, ``acall_many``), one
result type (:class:`ToolResult`) and one exception hierarchy (:class:`ToolhostError`):

- :class:`InProcess` — the C++ host in this process (fastest);
- :class:`Pool` — a pool of ``machina-toolhost --serve`` processes, pipelined;
- :class:`Nats` — the hosts of a ``machina-toolhost --nats`` group, over NATS (docs/nats.md);
- :class:`Spawn` — one ``machina-toolhost --run`` process per call
  (and :func:`run_machina_toolhost`, the dispatch client's function, which returns dicts).

See docs/python.md.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from . import _core
from ._arguments import fspaths
from ._core import Session, issue_lease
from ._errors import (
    AccessDenied,
    AuditUnavailable,
    BreakerOpen,
    Cancelled,
    CapabilityRefused,
    DispatchError,
    ExecutableNotFound,
    HostError,
    IdempotencyConflict,
    InternalError,
    InvalidInput,
    LeaseError,
    LeaseRejected,
    LeaseRequired,
    Overloaded,
    ProtocolError,
    RequestRejected,
    ServiceError,
    SystemFailure,
    TargetNotFound,
    ToolCrashed,
    ToolError,
    ToolFailed,
    ToolFault,
    ToolhostError,
    ToolNotFound,
    ToolTimeout,
)
from ._locate import find_executable, find_worker_executable
from ._result import ToolResult
from ._transport import Call, Transport
from .ds_state import Artifact, DsDelta, DsState
from .hosted_servers import Mcp, Skill
from .inprocess import InProcess, builtin_plugin_path
from .llm import ToolCall, ToolCatalog, arun_tool_calls, parse_tool_calls, run_tool_calls, tool_name
from .nats_client import Nats
from .pool import Pool
from .spawn import Spawn, run_machina_toolhost

__all__ = [
    "ToolCall",
    "ToolCatalog",
    "arun_tool_calls",
    "parse_tool_calls",
    "run_tool_calls",
    "tool_name",
    "Artifact",
    "BreakerOpen",
    "AccessDenied",
    "AuditUnavailable",
    "Cancelled",
    "Call",
    "CapabilityRefused",
    "DispatchError",
    "DsDelta",
    "DsState",
    "ExecutableNotFound",
    "Host",
    "HostError",
    "IdempotencyConflict",
    "InProcess",
    "InternalError",
    "InvalidInput",
    "LeaseError",
    "LeaseRejected",
    "LeaseRequired",
    "Mcp",
    "Nats",
    "Overloaded",
    "Pool",
    "ProtocolError",
    "RequestRejected",
    "ServiceError",
    "SystemFailure",
    "TargetNotFound",
    "Session",
    "Skill",
    "Spawn",
    "ToolCrashed",
    "ToolError",
    "ToolFailed",
    "ToolFault",
    "ToolNotFound",
    "ToolResult",
    "ToolTimeout",
    "ToolhostError",
    "Transport",
    "__version__",
    "builtin_plugin_path",
    "find_executable",
    "get_include",
    "issue_lease",
    "plugin_dir",
    "run_machina_toolhost",
]

__version__: str = _core.__version__

# Compiled files (the _core module, the plugin pack, the ABI headers) are installed
# together; in an editable install they live apart from the Python sources.
_PACKAGE_DIR = Path(_core.__file__).resolve().parent


def plugin_dir() -> Path:
    """The folder holding the built-in plugin pack."""
    return _PACKAGE_DIR / "plugins"


def get_include() -> Path:
    """The folder with ``machina/plugin_abi.h`` and ``machina/plugin.hpp`` for plugin authors."""
    return _PACKAGE_DIR / "include"


class Host(_core.Host):
    """The C++ host in this process, at the level of the wire (``call_json``) and of
    single calls (``call``); :class:`InProcess` is the transport built on it.

    Args:
        plugins: plugin libraries to load; ``None`` loads the built-in plugin and the tool
            packs (files, shell, code, python; docs/tool-packs.md) under the policy
            ``$MACHINA_TOOLHOST_POLICY`` names, else safe defaults (add them by hand with ``add_packs``).
        **options: the host's options, each a keyword of the option table: their types,
            ranges and defaults are listed under "Host options" in docs/protocol.md and by
            ``_core.host_option_table()``. ``worker_executable`` defaults to the installed
            ``machina-toolhost`` when ``isolation="process"`` or the tool packs are loaded.

    Raises:
        HostError: a plugin cannot be loaded (the message names the file), an option is
            invalid, or lease enforcement is on (``MACHINA_LEASE_ENFORCE=1``) without a
            usable secret.
    """

    def __init__(self, plugins: Sequence[str | os.PathLike[str]] | None = None, **options: object) -> None:
        if not options.get("worker_executable"):
            found = find_worker_executable(None, str(options.get("isolation", "inline")), plugins is None)
            if found is not None:
                options["worker_executable"] = found
        super().__init__(**options)  # type: ignore[arg-type]
        self.load_default_tools(plugins=fspaths(plugins),
                                builtin_plugin=os.fspath(builtin_plugin_path()))

    def call(self, aid: str, input_json: str, session: Session, idempotency_key: str | None = None,
             lease_token: str | None = None, timeout_ms: int | None = None,
             ds_state_json: str | None = None, user: str | None = None) -> ToolResult:
        """Runs one call without a JSON envelope (the GIL is released while the tool runs).
        Never raises for a failed call: see the result's ``ok``."""
        result: ToolResult = _core.call(self, aid, input_json, session, idempotency_key, lease_token, timeout_ms,
                                        ds_state_json, user)
        return result
