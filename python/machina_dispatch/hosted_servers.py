"""Transports to a hosted server, a JSON-RPC child process: an MCP server over stdio
(:class:`Mcp`) or a skill (:class:`Skill`, the skill protocol: docs/specifications.md),
hosted by a :class:`~machina_dispatch.Host` in this process.

Each call goes through the host's rules like any other transport's — the deadline (the
child is told ``notifications/cancelled`` and answered ``timeout`` on time), the input
checks, the output cap, ds_state, the breaker — and comes back as a
:class:`~machina_dispatch.ToolResult`, raising the same exceptions. The child is supervised:
one that crashes, hangs or writes garbage costs only the calls in flight on it and is
started again (docs/mcp-and-skills.md). Tools are called by the name the child gives them or by
their aid (``AID.MCP.<NAME>.<TOOL>.v1``, ``AID.SKILL.<NAME>.<TOOL>.v1``).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import _core
from ._result import ToolResult
from ._transport import State
from .inprocess import InProcess

__all__ = ["Mcp", "Skill"]


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"{type(value).__name__} cannot be written to a tool manifest")


class _Hosted(InProcess):
    """An in-process host whose tools are one child's: calls by tool name or aid."""

    def _load(self, table: str, fields: Mapping[str, Any], timeout: float | None, options: dict[str, Any]) -> None:
        lines = [f"[[{table}]]"] + [f"{k} = {_toml(v)}" for k, v in fields.items() if v is not None]
        with tempfile.TemporaryDirectory(prefix="machina-") as folder:
            manifest = Path(folder) / "tools.toml"
            manifest.write_text("\n".join(lines) + "\n", encoding="utf-8")
            super().__init__(plugins=[], tools=[manifest], timeout=timeout, **options)
        self._finish()

    def _finish(self) -> None:
        #: The child's tools: the name it gives each, and its aid here.
        self.tools: dict[str, str] = {t["name"]: t["aid"] for t in self.host.list_tools()}

    def aid(self, tool: str) -> str:
        """The aid of the child's tool `tool` (a name it gave, or an aid already)."""
        return self.tools.get(tool, tool)

    def call(self, aid: str, inputs: Any = None, *, state: State | None = None,
             idempotency_key: str | None = None, lease_token: str | None = None,
             timeout: float | None = None, check: bool = True, user: str | None = None) -> ToolResult:
        """As :meth:`Transport.call <machina_dispatch.Transport.call>`; `aid` may be the
        child's own name for the tool."""
        result: ToolResult = _core._inprocess_call(self, self.tools.get(aid, aid), inputs, state=state,
                                                   idempotency_key=idempotency_key, lease_token=lease_token,
                                                   timeout=timeout, check=check, user=user)
        return result


class Mcp(_Hosted):
    """The tools of an MCP server spoken to over stdio, at the newest revision it serves: MCP
    2026-07-28 (no handshake, the protocol version in each request's ``_meta``) when it
    answers ``server/discover`` listing it, else the ``initialize`` handshake — as the
    official SDK's client does in its ``auto`` mode (docs/mcp-and-skills.md).

    Args:
        command: the server's program and arguments (``["python3", "server.py"]``).
        name: names its tools' aids (``AID.MCP.<NAME>.<TOOL>.v1``).
        cwd: its working directory (default: this process's).
        env: names of environment variables passed to it besides the host's few (PATH,
            HOME, ...); nothing else of this process's environment reaches it.
        sandbox, guarantees, memory_mb: its confinement, as a tool manifest's
            ``[[mcp_server]]`` says (docs/mcp-and-skills.md).
        start_timeout: seconds it may take to start and list its tools.
        timeout: default deadline of a call, in seconds.
        **options: host options, as :class:`machina_dispatch.Host` takes them.

    Raises:
        HostError: it could not be started, did not answer as MCP says, or cannot be
            confined as asked.
    """

    def __init__(self, command: Sequence[str | os.PathLike[str]], *, name: str = "server",
                 cwd: str | os.PathLike[str] | None = None, env: Sequence[str] = (), sandbox: bool = False,
                 guarantees: Mapping[str, bool] | None = None, memory_mb: int | None = None,
                 start_timeout: float | None = None, timeout: float | None = None, **options: Any) -> None:
        self._load("mcp_server", {
            "name": name, "command": [os.fspath(c) for c in command],
            "dir": os.path.abspath(os.fspath(cwd if cwd is not None else os.getcwd())),
            "env": list(env) or None, "sandbox": sandbox or None, "guarantees": dict(guarantees or {}) or None,
            "memory_mb": memory_mb,
            "start_timeout_ms": None if start_timeout is None else max(1, round(start_timeout * 1000)),
        }, timeout, options)


class Skill(_Hosted):
    """The tools of a skill: a skill directory (``manifest.json`` and ``SKILL.md``)
    or a command.

    Args:
        skill: the skill's directory, or its command (program and arguments).
        name: names its tools' aids (``AID.SKILL.<NAME>.<TOOL>.v1``); a directory's default
            is the name its ``SKILL.md`` gives.
        cwd: a command's working directory (default: this process's).
        methods: ``"lifecycle"`` (``lifecycle/*`` and ``shutdown``, the default) or ``"skill"`` (the skill
            runtime's ``skill/*``).
        tick_interval_ms: ``lifecycle/onTick`` (or ``skill/tick``) this often, 0: never (default:
            the host's ``skill_tick_ms``, 60 s, for a ``lifecycle/*`` skill; never for ``skill/*``).
        data_dir: where its ``data/read`` and ``data/write`` go.
        env, sandbox, guarantees, memory_mb, start_timeout, timeout, **options: as for :class:`Mcp`.

    Raises:
        HostError: it could not be started or did not answer ``initialize`` with its tools.
    """

    def __init__(self, skill: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *, name: str | None = None,
                 cwd: str | os.PathLike[str] | None = None, methods: str | None = None,
                 tick_interval_ms: int | None = None, data_dir: str | os.PathLike[str] | None = None,
                 env: Sequence[str] = (), sandbox: bool = False, guarantees: Mapping[str, bool] | None = None,
                 memory_mb: int | None = None, start_timeout: float | None = None, timeout: float | None = None,
                 **options: Any) -> None:
        if isinstance(skill, (str, os.PathLike)):
            directory, command = os.path.abspath(os.fspath(skill)), None
        else:
            directory = os.path.abspath(os.fspath(cwd if cwd is not None else os.getcwd()))
            command = [os.fspath(c) for c in skill]
        self._load("skill", {
            "name": name, "command": command, "dir": directory, "methods": methods,
            "tick_interval_ms": tick_interval_ms,
            "data_dir": None if data_dir is None else os.path.abspath(os.fspath(data_dir)),
            "env": list(env) or None, "sandbox": sandbox or None, "guarantees": dict(guarantees or {}) or None,
            "memory_mb": memory_mb,
            "start_timeout_ms": None if start_timeout is None else max(1, round(start_timeout * 1000)),
        }, timeout, options)
