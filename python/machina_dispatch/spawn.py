"""The spawn transport: one ``machina-toolhost --run`` process per call (docs/python.md).

The process is run by the core's supervisor (``_process.run_once``, ``posix_spawn``: a
fraction of what ``subprocess.Popen`` costs in Python) in a process group of its own;
stdin is written and stdout/stderr are read by one poll loop with the GIL released, so
nothing is buffered without bound: stdout stops being read at its cap (1 MiB, the dispatch
client's ``_TOOLHOST_MAX_OUTPUT``), stderr is drained as it comes and only its tail is kept. On
timeout the whole group is killed; every path reaps the process, so none is ever left
behind. Unlike ``subprocess`` it does not close descriptors that are not close-on-exec;
Python opens every descriptor close-on-exec.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Sequence
from typing import Any

from . import _core
from ._arguments import check_list_argument
from ._errors import ExecutableNotFound, ToolhostError
from ._locate import check_setup as check_host_setup
from ._locate import find_executable_for_plugins, not_found_message
from ._process import run_once
from ._result import ToolResult
from ._transport import (
    EMPTY_STATE_JSON,
    State,
    Transport,
    apply_state,
    call_texts,
    default_timeout,
    refuse,
    timeout_ms,
)
from .ds_state import DsState

__all__ = ["MAX_OUTPUT_BYTES", "Spawn", "run_machina_toolhost"]

MAX_OUTPUT_BYTES = 1024 * 1024  # the dispatch client's cap on what it reads of stdout
GRACE_S = 1.0  # after the deadline the host answers itself; this long more, and it is killed
# The error types of the dispatch function (docs/specifications.md).
DISPATCH_ERROR_TYPES = ("timeout", "crash", "parse_error", "empty_output", "tool_error", "not_found", "exception")


class Spawn(Transport):
    """Runs each call in a new ``machina-toolhost --run`` process.

    Args:
        executable: the ``machina-toolhost`` to run (found as usual otherwise).
        plugins: plugin libraries to load instead of the built-in pack.
        tools: TOML tool manifests whose tools to load too (``--tools``).
        args: extra command-line options for the host (e.g. ``["--isolation", "process"]``).
        timeout: default deadline in seconds.
        max_output_bytes: cap on what is read from stdout.
        env: the host's environment (default: this process's).
        check_setup: have the host list its tools once first, so that a set-up it refuses
            raises here rather than failing every call.

    Raises:
        ExecutableNotFound: no ``machina-toolhost`` executable.
        HostError: the host refuses the set-up (an unknown flag, a plugin that does not
            load): checked once per set-up, by having the host list its tools.
    """

    def __init__(self, executable: str | os.PathLike[str] | None = None, *,
                 plugins: Sequence[str | os.PathLike[str]] | None = None,
                 tools: Sequence[str | os.PathLike[str]] | None = None, args: list[str] | None = None,
                 timeout: float | None = None, max_output_bytes: int = MAX_OUTPUT_BYTES,
                 env: dict[str, str] | None = None, check_setup: bool = True) -> None:
        super().__init__(timeout)
        check_list_argument("plugins", plugins)
        check_list_argument("tools", tools)
        check_list_argument("args", args)
        found = find_executable_for_plugins(executable, plugins)
        if found is None:
            raise ExecutableNotFound(ToolResult.failure("", "not_found", not_found_message(executable)))
        self.executable = found
        self.args = ([a for p in plugins or [] for a in ("--plugin", os.fspath(p))]
                     + [a for t in tools or [] for a in ("--tools", os.fspath(t))] + list(args or []))
        if check_setup:
            check_host_setup(self.executable, self.args, env)
        self.max_output_bytes = max_output_bytes
        self.env = env

    def call(self, aid: str, inputs: Any = None, *, state: State | None = None,
             idempotency_key: str | None = None, lease_token: str | None = None,
             timeout: float | None = None, check: bool = True, user: str | None = None) -> ToolResult:
        """See :meth:`Transport.call`.

        Raises:
            ToolhostError: with ``check``, the subclass for the failure's kind.
        """
        texts = call_texts(aid, inputs, state)  # inputs first, then the timeout, as on every transport
        if isinstance(texts, ToolResult):
            return refuse(texts, check)
        input_json, sent_state = texts
        seconds = self.timeout if timeout is None else float(timeout)
        ms = timeout_ms(seconds)
        try:
            r = self._call(aid, input_json, sent_state, idempotency_key, lease_token, ms, seconds, user)
        except Exception as e:  # anything else on the Python side: the dispatch type "exception"
            r = ToolResult.failure(aid, "exception", f"{type(e).__name__}: {e}")
        apply_state(state, r)
        if check and not r.ok:
            r.raise_for_error()
        return r

    def _call(self, aid: str, input_json: str, sent_state: str | None, idempotency_key: str | None,
              lease_token: str | None, ms: int, timeout: float, user: str | None = None) -> ToolResult:
        request = _core.encode_request(0, aid, input_json, idempotency_key, lease_token, ms, sent_state, user)
        try:
            run = run_once([self.executable, *self.args, "--run", aid], self.env, request, timeout + GRACE_S,
                           self.max_output_bytes)
        except FileNotFoundError:
            return ToolResult.failure(aid, "not_found", f"machina-toolhost executable not found: {self.executable}")
        except PermissionError as e:
            return ToolResult.failure(aid, "not_found", f"machina-toolhost cannot be run: {e}")
        if run.ended == "timed_out":
            return ToolResult.failure(aid, "timeout", f"machina-toolhost did not answer within {timeout:g} s; "
                                      "its process group was killed")
        if run.ended == "output_over_cap":
            return ToolResult.failure(aid, "parse_error", f"stdout exceeded the {self.max_output_bytes}-byte cap; "
                                      "reading stopped and the process was killed")
        stdout, status, stderr_tail = run.stdout, run.exit_code, run.stderr_tail
        if status != 0:
            return ToolResult.failure(aid, "crash", f"machina-toolhost {run.how}"
                                      + (f"; stderr: {stderr_tail}" if stderr_tail else ""),
                                      exit_status=status, stderr=stderr_tail)
        line = stdout.rstrip(b"\n")
        if not line:
            return ToolResult.failure(aid, "empty_output", "machina-toolhost exited 0 and wrote nothing on stdout"
                                      + (f"; stderr: {stderr_tail}" if stderr_tail else ""))
        if b"\n" in line:
            lines = line.count(b"\n") + 1
            return ToolResult.failure(aid, "parse_error", f"expected one response line on stdout, got {lines} lines")
        try:
            r: ToolResult = _core.decode_response(line, aid)
        except ValueError as e:
            return _codeless_failure(aid, line) or ToolResult.failure(aid, "parse_error",
                                                                      f"stdout is not a response: {e}")
        if r.ds_state_json:
            # --run answers with the full state; every transport reports what changed.
            r = r._replace(ds_state_json=_core.delta_between(sent_state or EMPTY_STATE_JSON, r.ds_state_json))
        return r


# Fields of a response line that are not a failure's details.
_RESPONSE_FIELDS = frozenset({"ok", "status", "error", "output_json", "ds_state", "code", "id", "trace",
                              "idempotent_hit", "aid", "type", "detail", "kind", "cls"})
_FAILED_STATUSES = frozenset({"TOOL_ERROR", "INVALID_PICK", "BREAKER_TRIP"})


def _codeless_failure(aid: str, line: bytes) -> ToolResult | None:
    """A failure answered without a wire ``code``, as hosts of the dispatch contract answer:
    the shortest form ``{"ok": false, "error": "..."}``, or a ``status`` other than ``OK``
    with its ``error``. It is a ``tool_error`` that keeps its text, its status and its other
    fields (``tier``, ``reason`` ...); ``None`` for any other line."""
    try:
        answer = json.loads(line)
    except ValueError:
        return None
    if not isinstance(answer, dict) or "code" in answer:
        return None
    status = answer.get("status", "TOOL_ERROR" if answer.get("ok") is False else "OK")
    if status not in _FAILED_STATUSES:
        return None
    error = answer.get("error")
    details = {k: v for k, v in answer.items() if k not in _RESPONSE_FIELDS}
    return ToolResult.failure(aid, "tool_error", error if isinstance(error, str) and error else "failed",
                              status=status, **details)


def run_machina_toolhost(aid: str, inputs: Any = None, *, timeout: float | None = None,
                         ds_state: DsState | dict[str, Any] | None = None, idempotency_key: str | None = None,
                         lease_token: str | None = None, executable: str | os.PathLike[str] | None = None,
                         plugins: Sequence[str | os.PathLike[str]] | None = None,
                         transport: Transport | None = None) -> str | dict[str, Any]:
    """The dispatch function (docs/specifications.md): runs one call, never raises.

    On success, the tool's ``output_json`` string; on failure
    the dispatch dict ``{"error": True, "aid", "type", "detail"}`` (plus ``code``, ``status``
    and details when the host answered). ``type`` is ``tool_error`` for any answer of the
    host whose ``status`` is not ``OK`` (its wire code in ``code``), else one of
    ``timeout``, ``crash``, ``parse_error``, ``empty_output``, ``not_found``,
    ``exception`` (see docs/python.md). The rich result is :meth:`Spawn.call`'s.

    Args:
        aid: the tool.
        inputs: dict, list, JSON string or None (``{}``).
        timeout: seconds; default ``$MACHINA_TOOLHOST_TIMEOUT`` or 30.
        ds_state: a :class:`DsState` (updated in place) or a full-state wire dict (sent as it
            is and left unchanged).
        idempotency_key, lease_token: as in :meth:`Transport.call`.
        executable, plugins: for the default spawn transport.
        transport: run through this transport instead of spawning (same result).
    """
    try:
        # A wire dict is sent as given but not written to: the caller keeps it as it was.
        state = copy.deepcopy(ds_state) if isinstance(ds_state, dict) else ds_state
        # Nothing is checked before the call (a host that cannot start is that call's crash),
        # so that every failure comes back as the call's dict.
        t = transport if transport is not None else Spawn(executable, plugins=plugins,
                                                          timeout=timeout or default_timeout(), check_setup=False)
        r = t.call(aid, inputs, state=state, idempotency_key=idempotency_key, lease_token=lease_token,
                   timeout=timeout, check=False)
    except ToolhostError as e:  # no executable, a set-up the host refuses
        r = e.result._replace(aid=aid)
    except Exception as e:
        r = ToolResult.failure(aid, "exception", f"{type(e).__name__}: {e}")
    if r.ok:
        return r.output_json
    out = r.to_dict()
    if r.code is not None:
        out["type"] = "tool_error"  # the host answered, status not OK: its code says which failure
    elif out["type"] not in DISPATCH_ERROR_TYPES:
        out["type"] = "exception"  # refused on the Python side: the dispatch type for it
    return out
