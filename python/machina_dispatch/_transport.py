"""What every transport offers: one call, a batch of calls, sync and asyncio, one result
type (:class:`ToolResult`), one exception hierarchy, one set of call options.

Deadlines: every call has one, ``timeout`` seconds (the argument, else the transport's
default, else ``$MACHINA_TOOLHOST_TIMEOUT``, else 30 s). It is sent to the host as the
request's ``timeout_ms``, so the host answers ``timeout`` on time; a transport that gets
no answer a grace period later treats the host as wedged.

ds_state: a call given ``state=`` (a :class:`DsState`, or a full-state wire dict as
:func:`run_machina_toolhost` takes it) sends it whole and applies the tool's changes to it
in place when the call succeeds; a call given none runs with an empty state.

What cannot be sent — inputs with no JSON form (a set, NaN), bytes that are not UTF-8, a
state that is not one — is refused before anything is sent, alike on every transport: a
failed result of kind ``invalid_input`` or ``invalid_ds_state`` (status ``INVALID_PICK``),
raised as :class:`InvalidInput` / :class:`RequestRejected` with ``check``.
"""

from __future__ import annotations

import asyncio
import math
import os
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Iterable, Mapping, MutableMapping, Sequence
from typing import Any, NamedTuple, TypeVar, cast

from ._inputs import to_input_json
from ._result import ToolResult
from .ds_state import DsDelta, DsState

State = DsState | MutableMapping[str, Any]

__all__ = ["DEFAULT_TIMEOUT_S", "Call", "Transport", "default_timeout"]

DEFAULT_TIMEOUT_S = 30.0
EMPTY_STATE_JSON = '{"slots":{}}'


def input_text(aid: str, inputs: Any) -> str | ToolResult:
    """The call's ``input_json``, or the failure that refuses a call whose inputs cannot be
    sent (see the module docstring)."""
    try:
        return to_input_json(inputs)
    except (TypeError, ValueError) as e:  # (UnicodeDecodeError is a ValueError)
        return ToolResult.failure(aid, "invalid_input", f"inputs cannot be sent as JSON: {e}", status="INVALID_PICK")


def state_text(aid: str, state: State | None) -> str | ToolResult | None:
    """The call's ``ds_state`` (full state) as JSON text, ``None`` for no state, or the
    failure that refuses a call whose state is not one."""
    if state is None:
        return None
    if isinstance(state, DsState):
        return state.to_json()
    try:
        if not isinstance(state, Mapping):
            raise TypeError("state must be a DsState or a wire dict ({'slots': {...}}), "
                            f"not {type(state).__name__}")
        return DsState.from_wire(state).to_json()
    except KeyError as e:
        return ToolResult.failure(aid, "invalid_ds_state", f"invalid ds_state: an artifact lacks its field {e}",
                                  status="INVALID_PICK")
    except (TypeError, ValueError, AttributeError) as e:
        return ToolResult.failure(aid, "invalid_ds_state", f"invalid ds_state: {e}", status="INVALID_PICK")


def call_texts(aid: str, inputs: Any, state: State | None) -> tuple[str, str | None] | ToolResult:
    """A call's ``input_json`` and ``ds_state`` texts (text inputs as they are), or the
    failure that refuses the call before sending."""
    input_json = inputs if type(inputs) is str else input_text(aid, inputs)
    if isinstance(input_json, ToolResult):
        return input_json
    if state is None:
        return input_json, None
    state_json = state_text(aid, state)
    if isinstance(state_json, ToolResult):
        return state_json
    return input_json, state_json


def refuse(result: ToolResult, check: bool) -> ToolResult:
    """A call refused before it was sent: returned, or raised with ``check``."""
    return result.raise_for_error() if check else result


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
    state: State | None = None
    user: str | None = None


def as_call(item: Call | tuple[Any, ...] | str) -> Call:
    if isinstance(item, Call):
        return item
    if isinstance(item, str):
        return Call(item)
    return Call(*item)


_MORE_FIELDS = (None,) * (len(Call._fields) - 1)


def call_fields(item: Call | tuple[Any, ...] | str) -> tuple[Any, ...]:
    """A batch item's seven fields, in Call's order. A plain tuple is padded rather than
    made a Call: a batch's own cost per call is a few microseconds, and a Call is one."""
    if type(item) is tuple and 0 < len(item) <= len(Call._fields):
        return item + _MORE_FIELDS[len(item) - 1:]
    return as_call(item)


def as_user(user: str | None) -> dict[str, str]:
    """`user` as a keyword, only when one is given: a transport written before `user`
    existed (a subclass of Transport outside this package) keeps working."""
    return {} if user is None else {"user": user}


def apply_state(state: State | None, result: ToolResult) -> None:
    """A successful call's changes, applied to the state it was given (in place)."""
    if state is None or not result.ok or not result.ds_state_json:
        return
    delta = DsDelta.from_json(result.ds_state_json)
    if isinstance(state, DsState):
        state.apply(delta)
        return
    # A wire dict: its slots keep the naming they came with ("DS3", or "3" as the original
    # client names them).
    wire = cast(dict[str, Any], state)
    slots: dict[str, Any] = wire.setdefault("slots", {})
    numbered = bool(slots) and all(str(k).isdigit() for k in slots)
    for name in (*delta.removed, *delta.slots):  # "DS3" and "3" alike
        slots.pop(name, None)
        slots.pop(name[2:], None)
    for name, artifact in delta.slots.items():
        slots[name[2:] if numbered else name] = artifact.to_wire()


_T = TypeVar("_T", bound="Transport")  # `with Pool(...) as p` gives p the Pool's own type


class Transport(ABC):
    """A way to reach the host. Use as a context manager or call :meth:`close`."""

    def __init__(self, timeout: float | None = None) -> None:
        self.timeout = default_timeout() if timeout is None else float(timeout)
        timeout_ms(self.timeout)  # checks it

    @abstractmethod
    def call(self, aid: str, inputs: Any = None, *, state: State | None = None,
             idempotency_key: str | None = None, lease_token: str | None = None,
             timeout: float | None = None, check: bool = True, user: str | None = None) -> ToolResult:
        """Runs one tool call.

        Args:
            aid: the tool.
            inputs: the tool's input: a dict/list/number (encoded as JSON), a str (JSON
                text, sent as it is), or None (``{}``).
            state: the ds_state to run with (a DsState or a full-state wire dict); updated
                in place with the tool's changes.
            idempotency_key: deduplicates calls with the same key and input (see the
                protocol reference).
            lease_token: a lease for a tool of tier > 0 when leases are enforced.
            timeout: seconds; see the module docstring.
            check: raise on failure (the default, as for every method of every transport)
                or return the failed result.
            user: who calls (1 to 256 bytes): selects the tool packs' policy scope (that
                user's roots and codebases) and is recorded in the audit store.

        Raises:
            ToolhostError: with ``check``, the subclass for the failure's kind.
        """

    def acall(self, aid: str, inputs: Any = None, *, state: State | None = None,
              idempotency_key: str | None = None, lease_token: str | None = None,
              timeout: float | None = None, check: bool = True, user: str | None = None) -> Awaitable[ToolResult]:
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
                                        lease_token=lease_token, timeout=timeout, check=check, **as_user(user)))
        return run()

    def call_many(self, calls: Iterable[Call | tuple[Any, ...] | str], *, check: bool = True) -> list[ToolResult]:
        """Runs many calls; results in the same order. Transports that can pipeline do.

        Raises:
            ToolhostError: with ``check`` (the default, as for :meth:`call`), for the first
                failed call (all calls still ran); ``check=False`` returns every result.
        """
        results = [self.call(c.aid, c.inputs, state=c.state, idempotency_key=c.idempotency_key,
                             lease_token=c.lease_token, timeout=c.timeout, check=False, **as_user(c.user))
                   for c in map(as_call, calls)]
        return check_all(results) if check else results

    async def acall_many(self, calls: Iterable[Call | tuple[Any, ...] | str], *,
                         check: bool = True) -> list[ToolResult]:
        """:meth:`call_many` for asyncio.

        Raises:
            ToolhostError: with ``check``, for the first failed call (all calls still ran).
        """
        items = [as_call(c) for c in calls]
        results = list(await asyncio.gather(*(
            self.acall(c.aid, c.inputs, state=c.state, idempotency_key=c.idempotency_key,
                       lease_token=c.lease_token, timeout=c.timeout, check=False, **as_user(c.user))
            for c in items)))
        return check_all(results) if check else results

    def close(self) -> None:  # noqa: B027 - transports without resources need nothing
        """Releases the transport's resources (processes, threads)."""

    async def aclose(self) -> None:
        """:meth:`close` from asyncio, without blocking the event loop."""
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    def __enter__(self: _T) -> _T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self: _T) -> _T:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def check_all(results: Sequence[ToolResult]) -> list[ToolResult]:
    for r in results:
        r.raise_for_error()
    return list(results)
