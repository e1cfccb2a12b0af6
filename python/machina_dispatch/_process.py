"""Host processes, supervised by the core's ``machina::ChildProcess`` (``_core``).

Every process this package starts goes through here: the pool's ``--serve`` hosts
(:class:`HostProcess`), the spawn transport's ``--run`` hosts and the set-up check
(:func:`run_once`). Each runs in a process group of its own; its stderr is read as it comes
into a bounded tail; it is killed with its whole group and reaped, never left behind; its
end is described in the core's words ("was killed by signal 9 (SIGKILL: Killed)").
"""

from __future__ import annotations

from typing import NamedTuple

from . import _core

__all__ = ["STDERR_TAIL_BYTES", "HostProcess", "Finished", "run_once"]

STDERR_TAIL_BYTES = 4096


def _environment(env: dict[str, str] | None) -> list[str] | None:
    return None if env is None else [f"{k}={v}" for k, v in env.items()]


class Finished(NamedTuple):
    """How a process run by :func:`run_once` ended."""

    ended: str  # "exited", "timed_out" (its group was killed) or "output_over_cap" (killed)
    stdout: bytes
    exit_code: int  # its exit status, or -N for signal N
    how: str  # "exited with status 3", "was killed by signal 9 (SIGKILL: Killed)"
    stderr_tail: str


def run_once(argv: list[str], env: dict[str, str] | None, request: bytes, timeout_s: float,
             max_stdout: int) -> Finished:
    """Runs ``argv`` to completion with ``request`` on its stdin (the GIL released).

    Raises:
        OSError: it cannot be started (FileNotFoundError, PermissionError, ...).
    """
    return Finished(*_core.run_to_completion(argv[0], argv, _environment(env), request, timeout_s, max_stdout,
                                             STDERR_TAIL_BYTES))


class HostProcess:
    """One ``--serve`` process: its stdin and stdout descriptors (non-blocking) for the
    caller, its stderr drained by a thread of the core's into a bounded tail.

    The descriptors stay open (and their numbers taken) until this object goes: other
    threads may still be about to write or read them, and a closed number is soon given to
    another pipe, maybe a new host's. A dead host's pipes only say EPIPE/EOF.

    Raises:
        OSError: the executable cannot be started.
    """

    __slots__ = ("child", "fd_in", "fd_out", "pid")

    def __init__(self, argv: list[str], env: dict[str, str] | None) -> None:
        self.child = _core.ChildProcess(argv[0], argv, _environment(env), STDERR_TAIL_BYTES)
        self.pid: int = self.child.pid
        self.fd_in: int = self.child.input_fd
        self.fd_out: int = self.child.stdout_fd

    def kill(self) -> None:
        """SIGKILL to its process group (a no-op once it is reaped)."""
        self.child.kill()

    def wait_exit(self, timeout_s: float) -> bool:
        """Whether it has exited within `timeout_s` (not reaping it)."""
        return bool(self.child.wait_exit(timeout_s))

    def close_input(self) -> None:
        """End of input for the host (it answers what it has and exits). The caller holds
        the write lock, and nothing writes after it."""
        self.child.close_input()

    def end(self, wait_s: float) -> str:
        """Waits up to `wait_s` for it to exit, then kills what is left of its process group
        (while it is an unreaped zombie, so its group id cannot be reused), reaps it; says
        how it ended, with its stderr tail."""
        if wait_s > 0:
            self.child.wait_exit(wait_s)
        how = self.child.end(1.0)  # the stderr pipe ends once the whole group is gone
        tail = self.child.tail().strip()
        return f"machina-toolhost (pid {self.pid}) {how}" + (f"; stderr: {tail}" if tail else "")
