"""One ``--serve`` host process as a pool drives it: the part its two drivers share.

A :class:`PoolHost` owns the host process (:class:`~machina_dispatch._process.HostProcess`),
numbers the requests it sends, matches the responses to them (``_core.decode_responses``)
and fails every call open on it, at once, when the host dies or is taken as wedged. Two
drivers move the bytes:

* :class:`~machina_dispatch._pool_host_threaded.ThreadedPoolHost` — read by its sync
  callers' threads (whichever waiting thread holds the read lock reads for everyone).
* :class:`~machina_dispatch._pool_host_asyncio.AsyncioPoolHost` — read by one asyncio
  event loop (a call is a future the reader completes).

Both are bounded (``max_in_flight`` requests unanswered at most; callers beyond that wait)
and both apply the same rules: a host that dies fails its calls with ``crash`` (exit status
and stderr tail in the message); a call unanswered ``grace`` seconds after its deadline
means the host is wedged: it is killed, that call fails with ``timeout``, the others with
``crash``.
"""

from __future__ import annotations

import itertools
import os

from . import _core
from ._process import HostProcess
from ._result import ToolResult

__all__ = ["MAX_LINE_BYTES", "PoolHost", "Prepared"]

MAX_LINE_BYTES = 64 * 1024 * 1024  # no response of the host comes near this
READ_CHUNK = 256 * 1024

#: A call ready to send: (aid, input_json, idempotency_key, lease_token, timeout_ms,
#: ds_state_json, user).
Prepared = tuple[str, str, str | None, str | None, int, str | None, str | None]


class PoolHost:
    """What both drivers share: the host process, request ids, the aids of the requests
    open on it, the bytes of a response line read in part, and how it ended."""

    def __init__(self, argv: list[str], env: dict[str, str] | None, grace: float) -> None:
        self.host = HostProcess(argv, env)
        self.grace = grace
        self.aids: dict[int, str] = {}  # rid -> aid of every request sent and not yet answered
        self.ids = itertools.count(1)
        self.dead: str | None = None  # why, once it is gone
        self.buf = b""

    def fail_all(self, why: str | None, kind: str = "crash", kill: bool = False) -> None:
        """Every call open on the host fails at once with `kind`: the host is gone, or is
        made to go (`kill`). Each driver knows where its calls wait."""
        raise NotImplementedError

    def read(self) -> bytes | None:
        """What the host has written (without blocking); None when nothing has come, or
        when it is gone (then every open call has been failed, saying how it ended)."""
        try:
            chunk = os.read(self.host.fd_out, READ_CHUNK)
        except BlockingIOError:
            return None
        except OSError:
            chunk = b""
        if not chunk:
            self.fail_all(None)
            return None
        return chunk

    def decode(self, chunk: bytes) -> list[tuple[int, ToolResult]] | None:
        """The answers completed by `chunk` (what was just read), matched to their
        requests; None when the host broke the protocol (it is then killed and every call
        open on it fails with parse_error)."""
        buf = self.buf + chunk if self.buf else chunk
        try:
            done, used = _core.decode_responses(buf, 0, self.aids)
        except ValueError as e:
            self.fail_all(f"the host sent an unreadable response ({e}); it was killed", "parse_error", kill=True)
            return None
        self.buf = buf[used:]
        if len(self.buf) > MAX_LINE_BYTES:
            self.fail_all(f"a response line passed {MAX_LINE_BYTES} bytes; the host was killed", "parse_error",
                          kill=True)
            return None
        return done

    def end_host(self, why: str | None, kill: bool) -> str:
        """Ends the host (at once with `kill`, else it has half a second to exit by
        itself); what its open calls are failed with."""
        if kill:
            self.host.kill()
        how = self.host.end(0.0 if kill else 0.5)
        return f"{why}; {how}" if why else how
