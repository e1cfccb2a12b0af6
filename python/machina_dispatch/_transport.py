"""What every transport offers: one call, a batch of calls, sync and asyncio, one result
type (:class:`ToolResult`), one exception hierarchy, one set of call options.

Deadlines: every call has one, ``timeout`` seconds (the argument, else the transport's
default, else ``$MACHINA_TOOLHOST_TIMEOUT``, else 30 s). It is sent to the host as the
request's ``timeout_ms``, so the host answers ``timeout`` on time; a transport that gets
no answer a grace period later treats the host as wedged.

ds_state: a call given ``state=`` (a :class:`DsState`) sends it whole and applies the
tool's changes to it when the call succeeds; a call given none runs with an empty state.
"""

from __future__ import annotations

import asyncio
import math
import os
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Iterable, Sequence
from typing import Any, NamedTuple

from ._result import ToolResult
from .ds_state import DsDelta, DsState

__all__ = ["DEFAULT_TIMEOUT_S", "Call", "Transport", "default_timeout"]

DEFAULT_TIMEOUT_S = 30.0
EMPTY_STATE_JSON = '{"slots":{}}'


def default_timeout() -> float:
    """``$MACHINA_TOOLHOST_TIMEOUT`` (seconds), else 30.

    Raises:
        ValueError: the variable is set but is not a positive number.
    """
    raw = os.environ.get("MACHINA_TOOLHOST_TIMEOUT")
    if raw is None or raw.strip() == "":
        return DEFAULT_TIMEOUT_S
    value = float(raw)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"MACHINA_TOOLHOST_TIMEOUT must be a positive number of seconds, not {raw!r}")
    return value


def timeout_ms(seconds: float) -> int:
    """Seconds -> the request's ``timeout_ms`` (at least 1, at most the wire's maximum).

    Raises:
        ValueError: not a positive finite number.
    """
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"timeout must be a positive number of seconds, not {seconds!r}")
    return min(max(1, math.ceil(seconds * 1000)), 2_147_483_647)


class Call(NamedTuple):
    """One call of a batch (:meth:`Transport.call_many`)."""

    aid: str
    inputs: Any = None
    idempotency_key: str | None = None
    lease_token: str | None = None
    timeout: float | None = None
    state: DsState | None = None


def as_call(item: Call | tuple[Any, ...] | str) -> Call:
    if isinstance(item, Call):
        return item
    if isinstance(item, str):
        return Call(item)
    return Call(*item)


_MORE_FIELDS = (None,) * (len(Call._fields) - 1)


def call_fields(item: Call | tuple[Any, ...] | str) -> tuple[Any, ...]:
    """A batch item's six fields, in Call's order. A plain tuple is padded rather than
    made a Call: a batch's own cost per call is a few microseconds, and a Call is one."""
    if type(item) is tuple and 0 < len(item) <= len(Call._fields):
        return item + _MORE_FIELDS[len(item) - 1:]
    return as_call(item)


def apply_state(state: DsState | None, result: ToolResult) -> None:
    if state is not None and result.ok and result.ds_state_json:
        state.apply(DsDelta.from_json(result.ds_state_json))


class Transport(ABC):
    """A way to reach the host. Use as a context manager or call :meth:`close`."""

    def __init__(self, timeout: float | None = None) -> None:
        self.timeout = default_timeout() if timeout is None else float(timeout)
        timeout_ms(self.timeout)  # checks it

    @abstractmethod
    def call(self, aid: str, inputs: Any = None, *, state: DsState | None = None,
             idempotency_key: str | None = None, lease_token: str | None = None,
             timeout: float | None = None, check: bool = True) -> ToolResult:
        """Runs one tool call.

        Args:
            aid: the tool.
            inputs: the tool's input: a dict/list/number (encoded as JSON), a str (JSON
                text, sent as it is), or None (``{}``).
            state: the ds_state to run with; updated in place with the tool's changes.
            idempotency_key: deduplicates calls with the same key and input (see the
                protocol reference).
            lease_token: a lease for a tool of tier > 0 when leases are enforced.
            timeout: seconds; see the module docstring.
            check: raise on failure (default) or return the failed result.

        Raises:
            ToolhostError: with ``check``, the subclass for the failure's kind.
        """

    def acall(self, aid: str, inputs: Any = None, *, state: DsState | None = None,
              idempotency_key: str | None = None, lease_token: str | None = None,
              timeout: float | None = None, check: bool = True) -> Awaitable[ToolResult]:
        """:meth:`call` for asyncio: returns an awaitable (a coroutine, or a future on
        transports with a native asyncio path). The call runs in the default executor unless
        the transport has such a path, so the event loop never waits for a tool.

        Raises:
            ToolhostError: (from the await) with ``check``, the subclass for the failure's kind.
        """
        async def run() -> ToolResult:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(
                None, lambda: self.call(aid, inputs, state=state, idempotency_key=idempotency_key,
                                        lease_token=lease_token, timeout=timeout, check=check))
        return run()

    def call_many(self, calls: Iterable[Call | tuple[Any, ...] | str], *, check: bool = False) -> list[ToolResult]:
        """Runs many calls; results in the same order. Transports that can pipeline do.

        Raises:
            ToolhostError: with ``check``, for the first failed call (all calls still ran).
        """
        results = [self.call(c.aid, c.inputs, state=c.state, idempotency_key=c.idempotency_key,
                             lease_token=c.lease_token, timeout=c.timeout, check=False)
                   for c in map(as_call, calls)]
        return check_all(results) if check else results

    async def acall_many(self, calls: Iterable[Call | tuple[Any, ...] | str], *,
                         check: bool = False) -> list[ToolResult]:
        """:meth:`call_many` for asyncio.

        Raises:
            ToolhostError: with ``check``, for the first failed call (all calls still ran).
        """
        items = [as_call(c) for c in calls]
        results = list(await asyncio.gather(*(
            self.acall(c.aid, c.inputs, state=c.state, idempotency_key=c.idempotency_key,
                       lease_token=c.lease_token, timeout=c.timeout, check=False) for c in items)))
        return check_all(results) if check else results

    def close(self) -> None:  # noqa: B027 - transports without resources need nothing
        """Releases the transport's resources (processes, threads)."""

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_all(results: Sequence[ToolResult]) -> list[ToolResult]:
    for r in results:
        r.raise_for_error()
    return list(results)
