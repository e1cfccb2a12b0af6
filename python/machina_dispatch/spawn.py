"""The spawn transport: one ``machina-toolhost --run`` process per call (docs/python.md).

The process is started by ``_core.spawn`` (``posix_spawn``, a fraction of what
``subprocess.Popen`` costs in Python) in a process group of its own;
stdin is written and stdout/stderr are read by one poll loop in the calling thread, so
nothing is buffered without bound: stdout stops being read at its cap (1 MiB, the seed's
``_TOOLHOST_MAX_OUTPUT``), stderr is drained as it comes and only its tail is kept. On
timeout the whole group is killed; every path reaps the process, so none is ever left
behind. Unlike ``subprocess`` it does not close descriptors that are not close-on-exec;
Python opens every descriptor close-on-exec.
"""

from __future__ import annotations

import copy
import fcntl
import os
import select
import signal
import subprocess
import time
from typing import Any

from . import _core
from ._errors import ExecutableNotFound, ToolhostError
from ._locate import NOT_FOUND, find_executable
from ._locate import check_setup as check_host_setup
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

MAX_OUTPUT_BYTES = 1024 * 1024  # as the original client
STDERR_TAIL_BYTES = 4096
GRACE_S = 1.0  # after the deadline the host answers itself; this long more, and it is killed
SEED_TYPES = ("timeout", "crash", "parse_error", "not_found", "exception")  # the seed's dispatch error types


class Spawn(Transport):
    """Runs each call in a new ``machina-toolhost --run`` process.

    Args:
        executable: the ``machina-toolhost`` to run (found as usual otherwise).
        plugins: plugin libraries to load instead of the built-in pack.
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
                 plugins: list[str | os.PathLike[str]] | None = None, args: list[str] | None = None,
                 timeout: float | None = None, max_output_bytes: int = MAX_OUTPUT_BYTES,
                 env: dict[str, str] | None = None, check_setup: bool = True) -> None:
        super().__init__(timeout)
        found = find_executable(executable, loads_plugins=bool(plugins))
        if found is None:
            raise ExecutableNotFound(ToolResult.failure("", "not_found", NOT_FOUND))
        self.executable = found
        self.args = [a for p in plugins or [] for a in ("--plugin", os.fspath(p))] + list(args or [])
        if check_setup:
            check_host_setup(self.executable, self.args, env)
        self.max_output_bytes = max_output_bytes
        self.env = env

    def call(self, aid: str, inputs: Any = None, *, state: State | None = None,
             idempotency_key: str | None = None, lease_token: str | None = None,
             timeout: float | None = None, check: bool = True) -> ToolResult:
        """See :meth:`Transport.call`.

        Raises:
            ToolhostError: with ``check``, the subclass for the failure's kind.
        """
        seconds = self.timeout if timeout is None else float(timeout)
        ms = timeout_ms(seconds)
        texts = call_texts(aid, inputs, state)
        if isinstance(texts, ToolResult):
            return refuse(texts, check)
        input_json, sent_state = texts
        try:
            r = self._call(aid, input_json, sent_state, idempotency_key, lease_token, ms, seconds)
        except Exception as e:  # anything else on the Python side: the seed's "exception"
            r = ToolResult.failure(aid, "exception", f"{type(e).__name__}: {e}")
        apply_state(state, r)
        if check and not r.ok:
            r.raise_for_error()
        return r

    def _call(self, aid: str, input_json: str, sent_state: str | None, idempotency_key: str | None,
              lease_token: str | None, ms: int, timeout: float) -> ToolResult:
        request = _core.encode_request(0, aid, input_json, idempotency_key, lease_token, ms, sent_state)
        outcome = _run(self.executable, [*self.args, "--run", aid], request, timeout + GRACE_S,
                       self.max_output_bytes, self.env)
        if isinstance(outcome, ToolResult):
            return outcome._replace(aid=aid)
        stdout, status, stderr_tail = outcome
        if status != 0:
            return ToolResult.failure(aid, "crash", f"machina-toolhost {_describe(status)}"
                                      + (f"; stderr: {stderr_tail}" if stderr_tail else ""),
                                      exit_status=status, stderr=stderr_tail)
        line = stdout.rstrip(b"\n")
        if not line or b"\n" in line:
            lines = line.count(b"\n") + 1
            return ToolResult.failure(aid, "parse_error", "expected one response line on stdout, got "
                                      + (f"{lines} lines" if line else "nothing"))
        try:
            r: ToolResult = _core.decode_response(line, aid)
        except ValueError as e:
            return ToolResult.failure(aid, "parse_error", f"stdout is not a response: {e}")
        if r.ds_state_json:
            # --run answers with the full state; every transport reports what changed.
            r = r._replace(ds_state_json=_core.delta_between(sent_state or EMPTY_STATE_JSON, r.ds_state_json))
        return r


def _describe(status: int) -> str:
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return f"was killed by {name}"
    return f"exited with status {status}"


def _run(executable: str, args: list[str], request: bytes, deadline_s: float, max_out: int,
         env: dict[str, str] | None) -> tuple[bytes, int, str] | ToolResult:
    """Runs one host process to completion. Returns (stdout, exit status, stderr tail),
    or a failure result (not_found, timeout, parse_error for stdout over the cap)."""
    fds: list[int] = []  # every descriptor of ours, closed on the way out
    try:
        # The child's ends first: dup2 in the child must not clobber a pipe end that
        # landed on 0-2 (when this process runs with standard streams closed).
        in_r, in_w = _pipe(fds)
        out_r, out_w = _pipe(fds)
        err_r, err_w = _pipe(fds)
        try:
            pid = _core.spawn(executable, [executable, *args],
                              None if env is None else [f"{k}={v}" for k, v in env.items()], in_r, out_w, err_w)
        except FileNotFoundError:
            return ToolResult.failure("", "not_found", f"machina-toolhost executable not found: {executable}")
        except PermissionError as e:
            return ToolResult.failure("", "not_found", f"machina-toolhost cannot be run: {e}")
        for fd in (in_r, out_w, err_w):
            _close(fds, fd)
        return _exchange(pid, in_w, out_r, err_r, request, deadline_s, max_out, fds)
    finally:
        for fd in fds:
            os.close(fd)


def _exchange(pid: int, in_w: int, out_r: int, err_r: int, request: bytes, deadline_s: float, max_out: int,
              fds: list[int]) -> tuple[bytes, int, str] | ToolResult:
    """Writes the request, reads the answer and the stderr tail, reaps `pid`."""
    out = bytearray()
    tail = bytearray()
    pending = memoryview(request)
    failure: ToolResult | None = None
    end = time.monotonic() + deadline_s
    poller = select.poll()
    for fd in (in_w, out_r, err_r):
        os.set_blocking(fd, False)
    poller.register(in_w, select.POLLOUT)
    poller.register(out_r, select.POLLIN)
    poller.register(err_r, select.POLLIN)
    reading = {out_r, err_r}
    try:
        while reading:
            left = end - time.monotonic()
            if left <= 0:
                failure = ToolResult.failure("", "timeout", f"machina-toolhost did not answer within "
                                             f"{deadline_s - GRACE_S:g} s; its process group was killed")
                break
            if out_r not in reading:
                # The answer is complete. stderr may be held open by what a stuck tool
                # started; once the host itself has exited, that is all there is.
                if _exited(pid):
                    _drain(err_r, tail)
                    break
                left = min(left, 0.01)
            for fd, _ in poller.poll(left * 1000):
                if fd == in_w:
                    try:
                        pending = pending[os.write(in_w, pending):]
                    except BrokenPipeError:
                        pending = pending[:0]  # the host stopped reading: its answer says why
                    except BlockingIOError:
                        continue
                    if not pending:
                        poller.unregister(in_w)
                        _close(fds, in_w)
                    continue
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    poller.unregister(fd)
                    reading.discard(fd)
                elif fd == out_r:
                    out += chunk
                    if len(out) > max_out:
                        failure = ToolResult.failure("", "parse_error", f"stdout exceeded the {max_out}-byte "
                                                     "cap; reading stopped and the process was killed")
                        reading.clear()
                        break
                else:
                    _keep_tail(tail, chunk)
    finally:
        if failure is not None or out_r in reading:
            _kill_group(pid)
        status = _reap(pid, end)
    if failure is not None:
        return failure
    return bytes(out), status, tail[-STDERR_TAIL_BYTES:].decode("utf-8", "replace")


def _pipe(fds: list[int]) -> tuple[int, int]:
    """A close-on-exec pipe whose ends are above the standard streams, recorded in `fds`."""
    ends = []
    for fd in os.pipe2(os.O_CLOEXEC):
        if fd <= 2:
            moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
            os.close(fd)
            fd = moved
        fds.append(fd)
        ends.append(fd)
    return ends[0], ends[1]


def _close(fds: list[int], fd: int) -> None:
    fds.remove(fd)
    os.close(fd)


def _keep_tail(tail: bytearray, chunk: bytes) -> None:
    """Appends to the stderr tail, keeping it bounded (at most twice the tail kept)."""
    tail += chunk
    if len(tail) > 2 * STDERR_TAIL_BYTES:
        del tail[:-STDERR_TAIL_BYTES]


def _exited(pid: int) -> bool:
    """Whether `pid` has exited (left unreaped)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None
    except ChildProcessError:
        return True


def _drain(fd: int, tail: bytearray) -> None:
    """Whatever is already in a non-blocking pipe, into the tail."""
    for _ in range(64):
        try:
            chunk = os.read(fd, 65536)
        except (BlockingIOError, OSError):
            return
        if not chunk:
            return
        _keep_tail(tail, chunk)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError:  # pragma: no cover - the group is ours; kill the host at least
        os.kill(pid, signal.SIGKILL)


def _reap(pid: int, end: float) -> int:
    """Waits for the process to end (past the deadline, kills its group first), then kills
    whatever is left in its process group (what a stuck tool started) before reaping it:
    while the host is a zombie its pid, and so its group id, cannot be reused."""
    try:
        _wait_unreaped(pid, max(0.05, end - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    _kill_group(pid)
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:  # pragma: no cover - someone else reaped it
        return 0
    return os.waitstatus_to_exitcode(status)


def _wait_unreaped(pid: int, timeout: float) -> None:
    """Waits until `pid` has exited, leaving it unreaped.

    Raises:
        subprocess.TimeoutExpired: still running after `timeout` seconds.
    """
    end = time.monotonic() + timeout
    delay = 0.0005
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
                return
        except ChildProcessError:
            return
        if time.monotonic() > end:
            raise subprocess.TimeoutExpired(str(pid), timeout)
        time.sleep(delay)
        delay = min(delay * 2, 0.02)


def run_machina_toolhost(aid: str, inputs: Any = None, *, timeout: float | None = None,
                         ds_state: DsState | dict[str, Any] | None = None, idempotency_key: str | None = None,
                         lease_token: str | None = None, executable: str | os.PathLike[str] | None = None,
                         plugins: list[str | os.PathLike[str]] | None = None,
                         transport: Transport | None = None) -> str | dict[str, Any]:
    """The seed's dispatch function, a drop-in for the original: runs one call, never raises.

    On success, the tool's ``output_json`` string, as the original returns it; on failure
    the seed's dict ``{"error": True, "aid", "type", "detail"}`` (plus ``code``, ``status``
    and details when the host answered). ``type`` is one of the seed's ``timeout``,
    ``crash``, ``parse_error``, ``not_found``, ``exception``, or the host's error code
    (see docs/python.md). The rich result is :meth:`Spawn.call`'s.

    Args:
        aid: the tool.
        inputs: dict, list, JSON string or None (``{}``).
        timeout: seconds; default ``$MACHINA_TOOLHOST_TIMEOUT`` or 30.
        ds_state: a :class:`DsState` (updated in place) or a full-state wire dict (sent as it
            is and left unchanged, as by the original).
        idempotency_key, lease_token: as in :meth:`Transport.call`.
        executable, plugins: for the default spawn transport.
        transport: run through this transport instead of spawning (same result).
    """
    try:
        # A wire dict is sent as given but not written to: the original client leaves it alone.
        state = copy.deepcopy(ds_state) if isinstance(ds_state, dict) else ds_state
        # As the original: nothing is checked before the call (a host that cannot start is
        # that call's crash).
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
    if r.code is None and out["type"] not in SEED_TYPES:
        out["type"] = "exception"  # refused on the Python side: the seed's word for it
    return out
