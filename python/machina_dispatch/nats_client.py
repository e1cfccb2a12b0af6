"""The NATS transport: the same ``call``/``acall``/``call_many``/``acall_many``, results
and errors as the other transports, to the hosts of a ``machina-toolhost-nats`` group.

The transport keeps one NATS connection on an event loop of its own (a background
thread), so the sync methods work from any thread and the asyncio methods from any loop.
Each call is one request on ``PREFIX.call`` carrying our envelope; the group's queue
decides which host runs it.

When no host answers — none is subscribed (``service_unavailable`` at once), or the one
that took the call died (``service_unavailable`` after the deadline and a grace period) —
the result says so; the call may or may not have run on a host that died. Retry it with the
same ``idempotency_key``: with the group's shared store (``--idempotency kv``) a retry never
runs the tool a second time (docs/nats.md).

``durable=True`` publishes calls to the JetStream work queue instead (``--durable`` hosts):
the stream keeps each call until a host has answered and acknowledged it, so a call whose
host dies is delivered again to another host, which replays the stored answer rather than
running the tool twice.

The answers of the plain calls come back on one wildcard subscription of the transport's
own (``INBOX.<n>``, ``n`` numbering the requests), and a table finds each answer's call: a
batch is a run of publishes, at most ``max_in_flight`` out at once, with one timer for
every call's deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import uuid
from collections import deque
from collections.abc import Awaitable, Iterable
from concurrent.futures import Future
from heapq import heapify, heappop, heappush
from typing import Any, cast

import orjson

from . import _core
from ._errors import HostError
from ._nats_wire import (
    DEFAULT_PREFIX,
    DEFAULT_URL,
    HDR_MSG_ID,
    HDR_REPLY_TO,
    HDR_REQUEST_ID,
    call_subject,
    durable_subject,
    tools_subject,
)
from ._result import ToolResult
from ._transport import Call, State, Transport, apply_state, call_fields, call_texts, check_all, timeout_ms

__all__ = ["Nats"]

GRACE_S = 2.0  # past the call's deadline, how long to wait for the host's own timeout answer
CONNECT_TIMEOUT_S = 5.0
SWEEP_S = 0.05  # how often, at most, the deadline timer fires
STATUS_HEADER = "Status"  # the status of a message the server makes itself
NO_RESPONDERS_STATUS = "503"
CLOSED = "the NATS transport was closed before the answer came"

# A call as its caller gave it, with its deadline in seconds: aid, inputs, idempotency key,
# lease token, seconds, state, user. Its request is made on the transport's loop as the
# window gives it room, while the calls before it are out.
Fields = tuple[str, Any, str | None, str | None, float, State | None, str | None]


class _Batch:
    """The calls of one ``call``, ``acall``, ``call_many`` or ``acall_many``: their results
    by index, and a future done once each has one."""

    __slots__ = ("done", "items", "left", "results")

    def __init__(self, items: list[Fields], done: asyncio.Future[None]) -> None:
        self.items = items
        self.results: list[ToolResult | None] = [None] * len(items)
        self.left = len(items)
        self.done = done
        if not items:
            done.set_result(None)

    def give(self, i: int, result: ToolResult) -> None:
        self.results[i] = result
        self.left -= 1
        if self.left == 0 and not self.done.done():
            self.done.set_result(None)


class _Window:
    """At most ``cap`` calls out at once; a sender that finds no room waits its turn (on
    the transport's loop only)."""

    __slots__ = ("_waiters", "cap", "free")

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.free = cap
        self._waiters: deque[asyncio.Future[None]] = deque()

    def take(self, n: int) -> int:
        """Up to ``n`` places: as many as are free."""
        k = n if n <= self.free else self.free
        self.free -= k
        return k

    def give(self, n: int = 1) -> None:
        self.free += n
        if self._waiters:
            for _ in range(min(n, len(self._waiters))):
                self._wake()

    async def room(self) -> None:
        """Until a place is given back (or every sender is woken, at close)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._wake()  # woken, then cancelled: the turn goes to the next
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(fut)
            raise

    def wake_all(self) -> None:
        while self._waiters:
            self._wake()

    def _wake(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return


class Nats(Transport):
    """Calls tools on the hosts of a ``machina-toolhost-nats`` group.

    Args:
        url: the NATS server (``nats://host:port``; a list for a cluster).
        prefix: the hosts' subject prefix.
        durable: send calls through the JetStream work queue (at-least-once delivery).
        redelivery_s: durable mode: how much longer than the deadline to wait for an answer
            (a call whose host died is delivered again after the hosts' ``--ack-wait-s``).
        timeout: default deadline in seconds (see :mod:`machina_dispatch._transport`).
        max_in_flight: calls this transport has out at once (1024); more wait in the client.
            A host holds at most its ``--max-pending`` waiting messages and the server drops
            beyond that, so a window below it keeps one client's batch from being dropped.
        connect_options: more keyword arguments for ``nats.connect`` (credentials, TLS).

    Raises:
        HostError: nats-py is not installed, or the server cannot be reached.
    """

    def __init__(self, url: str | list[str] = DEFAULT_URL, *, prefix: str = DEFAULT_PREFIX, durable: bool = False,
                 redelivery_s: float = 60.0, timeout: float | None = None, max_in_flight: int = 1024,
                 connect_options: dict[str, Any] | None = None) -> None:
        super().__init__(timeout)
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
            raise ValueError(f"max_in_flight must be a positive integer, not {max_in_flight!r}")
        try:
            import nats
        except ImportError:
            raise HostError(ToolResult.failure("", "host_error", "the NATS transport needs nats-py "
                                                                 "(pip install 'machina-toolhost[nats]')")) from None
        self.prefix = prefix
        self.durable = durable
        self.redelivery_s = float(redelivery_s)
        self._subject = durable_subject(prefix) if durable else call_subject(prefix)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="machina-nats", daemon=True)
        self._thread.start()
        # Used on self._loop only:
        self._window = _Window(max_in_flight)
        self._calls: dict[int, tuple[_Batch, int]] = {}  # request number -> its call, until answered
        self._deadlines: list[tuple[float, int]] = []  # heap of (loop time, request number)
        self._timer: asyncio.TimerHandle | None = None
        self._next_request = 0
        self._last_ms = (self.timeout, timeout_ms(self.timeout))  # seconds -> the request's timeout_ms
        self._replies = ""  # the reply subjects' prefix (an inbox of ours, and a dot)
        self._waiting: dict[str, asyncio.Future[bytes]] = {}  # durable mode: request id -> its answer
        self._inbox = ""
        self._ids = itertools.count()
        self._closed = False

        async def connect() -> Any:
            # Reconnects for ever once connected; the first connection is given CONNECT_TIMEOUT_S.
            return await asyncio.wait_for(nats.connect(url, connect_timeout=2, max_reconnect_attempts=-1,
                                                       reconnect_time_wait=0.5, **(connect_options or {})),
                                          CONNECT_TIMEOUT_S)
        try:
            self._nc = asyncio.run_coroutine_threadsafe(connect(), self._loop).result(CONNECT_TIMEOUT_S * 3)
            if durable:
                self._js = self._nc.jetstream()
            listen = self._listen() if durable else self._subscribe_replies()
            asyncio.run_coroutine_threadsafe(listen, self._loop).result(CONNECT_TIMEOUT_S)
        except Exception as e:
            self._stop_loop()
            why = "no server answered" if isinstance(e, (asyncio.TimeoutError, TimeoutError)) else str(e)
            raise HostError(ToolResult.failure("", "host_error", f"cannot connect to NATS at {url}: {why}")) from None

    # ---- sync and asyncio entry points

    def call(self, aid: str, inputs: Any = None, *, state: State | None = None,
             idempotency_key: str | None = None, lease_token: str | None = None,
             timeout: float | None = None, check: bool = True, user: str | None = None) -> ToolResult:
        return self._submit(aid, inputs, state, idempotency_key, lease_token, timeout, check, user).result()

    def acall(self, aid: str, inputs: Any = None, *, state: State | None = None,
              idempotency_key: str | None = None, lease_token: str | None = None,
              timeout: float | None = None, check: bool = True, user: str | None = None) -> Awaitable[ToolResult]:
        return asyncio.wrap_future(self._submit(aid, inputs, state, idempotency_key, lease_token, timeout, check,
                                                user))

    def call_many(self, calls: Iterable[Call | tuple[Any, ...] | str], *, check: bool = True) -> list[ToolResult]:
        items = self._fields(calls)
        return self._finish(items, self._send(items).result(), check)

    async def acall_many(self, calls: Iterable[Call | tuple[Any, ...] | str], *,
                         check: bool = True) -> list[ToolResult]:
        items = self._fields(calls)
        return self._finish(items, await asyncio.wrap_future(self._send(items)), check)

    def list_tools(self) -> list[dict[str, Any]]:
        """The tools a host of the group serves (as ``machina-toolhost --list`` prints them).

        Raises:
            ServiceError: no host answers.
        """
        async def ask() -> bytes:
            msg = await self._nc.request(tools_subject(self.prefix), b"", timeout=self.timeout)
            data: bytes = msg.data
            return data
        try:
            data = asyncio.run_coroutine_threadsafe(ask(), self._loop).result()
        except Exception as e:
            self._no_answer("", e, self.timeout).raise_for_error()
        tools: list[dict[str, Any]] = orjson.loads(data)
        return tools

    def close(self) -> None:
        """Closes the connection (calls still waiting get ``service_unavailable``)."""
        if self._closed:
            return
        self._closed = True

        async def drain() -> None:
            self._fail_open()
            for fut in self._waiting.values():
                if not fut.done():
                    fut.cancel()
            try:
                await asyncio.wait_for(self._nc.drain(), 5.0)
            except Exception:
                await self._nc.close()
        try:
            asyncio.run_coroutine_threadsafe(drain(), self._loop).result(10.0)
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)
        if not self._thread.is_alive():
            self._loop.close()

    # ---- the calls, taken in the caller's thread

    def _seconds(self, aid: str, inputs: Any, state: State | None, timeout: float | None) -> float:
        """The call's deadline in seconds.

        Raises:
            ValueError: not a positive number, for a call whose inputs can be sent (one whose
                inputs cannot is refused for them, as on every transport).
        """
        if timeout is None:
            return self.timeout
        seconds = float(timeout)
        try:
            timeout_ms(seconds)
        except ValueError:
            if not isinstance(call_texts(aid, inputs, state), ToolResult):
                raise
        return seconds

    def _fields(self, calls: Iterable[Call | tuple[Any, ...] | str]) -> list[Fields]:
        if self._closed:
            raise RuntimeError("the NATS transport is closed")
        items: list[Fields] = []
        for c in calls:
            aid, inputs, key, lease, timeout, state, user = call_fields(c)
            items.append((aid, inputs, key, lease, self._seconds(aid, inputs, state, timeout), state, user))
        return items

    @staticmethod
    def _finish(items: list[Fields], results: list[ToolResult], check: bool) -> list[ToolResult]:
        """The states updated; raises the first failure with ``check``."""
        for item, result in zip(items, results, strict=True):
            if item[5] is not None:
                apply_state(item[5], result)
        return check_all(results) if check else results

    def _submit(self, aid: str, inputs: Any, state: State | None, key: str | None, lease: str | None,
                timeout: float | None, check: bool, user: str | None = None) -> Future[ToolResult]:
        if self._closed:
            raise RuntimeError("the NATS transport is closed")
        try:
            item: Fields = (aid, inputs, key, lease, self._seconds(aid, inputs, state, timeout), state, user)
        except (TypeError, ValueError) as e:
            failed: Future[ToolResult] = Future()
            failed.set_exception(e)
            return failed

        async def run() -> ToolResult:
            result = (await self._exchange([item]))[0]
            apply_state(state, result)
            return result.raise_for_error() if check else result
        return asyncio.run_coroutine_threadsafe(run(), self._loop)

    def _send(self, items: list[Fields]) -> Future[list[ToolResult]]:
        return asyncio.run_coroutine_threadsafe(self._exchange(items), self._loop)

    # ---- on the transport's loop

    async def _exchange(self, items: list[Fields]) -> list[ToolResult]:
        """Sends the calls as the window gives room; their results, in order."""
        if self.durable:
            return list(await asyncio.gather(*(self._durable_call(item) for item in items)))
        batch = _Batch(items, self._loop.create_future())
        sent = 0
        try:
            while sent < len(items):
                if self._closed:
                    for i in range(sent, len(items)):
                        batch.give(i, ToolResult.failure(items[i][0], "service_unavailable", CLOSED))
                    break
                room = self._window.take(len(items) - sent)
                if room == 0:
                    await self._window.room()
                    continue
                await self._publish(batch, sent, sent + room)
                sent += room
            await batch.done
        except BaseException:  # cancelled (or an input whose encoding raised): its calls out go
            self._forget(batch)
            raise
        return batch.results  # type: ignore[return-value]  # (each has its result once done)

    def _request(self, item: Fields) -> bytes | ToolResult:
        """The call's request, or the failure that refuses it before sending."""
        aid, inputs, key, lease, seconds, state, user = item
        texts = call_texts(aid, inputs, state)
        if isinstance(texts, ToolResult):
            return texts
        if seconds != self._last_ms[0]:  # the calls of a batch mostly share one deadline
            self._last_ms = (seconds, timeout_ms(seconds))
        envelope: dict[str, Any] = {"aid": aid, "input_json": texts[0], "timeout_ms": self._last_ms[1]}
        if key is not None:
            envelope["idempotency_key"] = key
        if user is not None:
            envelope["user"] = user
        if lease is not None:
            envelope["_lease_token"] = lease
        body = orjson.dumps(envelope)
        if texts[1] is not None:  # the state, already JSON text: spliced in, not parsed again
            body = body[:-1] + b',"ds_state":' + texts[1].encode() + b"}"
        if len(body) > self._nc.max_payload:
            return ToolResult.failure(aid, "request_too_large", f"request of {len(body)} bytes exceeds the NATS "
                                      f"server's max_payload of {self._nc.max_payload} bytes", status="INVALID_PICK")
        return body

    async def _publish(self, batch: _Batch, first: int, last: int) -> None:
        """Sends calls first..last-1 of the batch, each given a place in the window: their
        requests are made, then numbered and watched, then published."""
        items = batch.items
        try:
            bodies = [self._request(items[i]) for i in range(first, last)]
        except BaseException:
            self._window.give(last - first)
            raise
        calls, deadlines = self._calls, self._deadlines
        base = self._next_request - first
        self._next_request += last - first
        due = self._loop.time() + GRACE_S
        for i, body in enumerate(bodies, first):
            if type(body) is bytes:
                calls[base + i] = (batch, i)
                heappush(deadlines, (due + items[i][4], base + i))
            else:  # refused before sending: its place is free again
                self._window.give()
                batch.give(i, cast(ToolResult, body))
        if len(deadlines) > 4 * self._window.cap + 4096:  # answered calls' entries, dropped
            deadlines[:] = [d for d in deadlines if d[1] in calls]
            heapify(deadlines)
        self._arm()
        publish, subject, replies = self._nc.publish, self._subject, self._replies
        for i, body in enumerate(bodies, first):
            if type(body) is not bytes:
                continue
            try:
                await publish(subject, body, reply=f"{replies}{base + i}")
            except Exception as e:
                if calls.pop(base + i, None) is not None:
                    self._window.give()
                    batch.give(i, self._no_answer(items[i][0], e, items[i][4]))

    async def _subscribe_replies(self) -> None:
        self._replies = self._nc.new_inbox() + "."
        await self._nc.subscribe(self._replies + "*", cb=self._on_reply)

    async def _on_reply(self, msg: Any) -> None:
        try:
            request = int(msg.subject[len(self._replies):])
        except ValueError:
            return
        call = self._calls.pop(request, None)
        if call is None:
            return  # a second answer, one past the call's deadline, or none of ours
        self._window.give()
        batch, i = call
        aid = batch.items[i][0]
        headers = msg.headers
        if headers and headers.get(STATUS_HEADER) == NO_RESPONDERS_STATUS:
            from nats.errors import NoRespondersError

            batch.give(i, self._no_answer(aid, NoRespondersError(), batch.items[i][4]))
            return
        try:
            batch.give(i, _core.decode_response(msg.data, aid))
        except ValueError as e:
            batch.give(i, ToolResult.failure(aid, "parse_error", f"unreadable answer from a NATS host: {e}"))

    def _arm(self) -> None:
        """The timer, set for the first deadline (no sooner than SWEEP_S from now)."""
        if not self._deadlines:
            return
        when = max(self._deadlines[0][0], self._loop.time() + SWEEP_S)
        if self._timer is not None:
            if self._timer.when() <= when:
                return
            self._timer.cancel()
        self._timer = self._loop.call_at(when, self._sweep)

    def _sweep(self) -> None:
        """Every call past its deadline and the grace period: no answer."""
        self._timer = None
        now = self._loop.time()
        deadlines, calls = self._deadlines, self._calls
        while deadlines and deadlines[0][0] <= now:
            call = calls.pop(heappop(deadlines)[1], None)
            if call is not None:
                self._window.give()
                batch, i = call
                batch.give(i, self._no_answer(batch.items[i][0], TimeoutError(), batch.items[i][4]))
        self._arm()

    def _forget(self, batch: _Batch) -> None:
        """A cancelled batch: its calls out give back their places (their answers go nowhere)."""
        for request in [r for r, (b, _) in self._calls.items() if b is batch]:
            del self._calls[request]
            self._window.give()

    def _fail_open(self) -> None:
        """At close: every call out, and every one waiting for room, is answered."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        open_calls = list(self._calls.values())
        self._calls.clear()
        self._deadlines.clear()
        for batch, i in open_calls:
            self._window.give()
            batch.give(i, ToolResult.failure(batch.items[i][0], "service_unavailable", CLOSED))
        self._window.wake_all()

    def _no_answer(self, aid: str, e: Exception, seconds: float) -> ToolResult:
        from nats.errors import NoRespondersError
        from nats.js.errors import NoStreamResponseError

        if isinstance(e, NoRespondersError):
            why = f"no machina-toolhost-nats host serves {self._subject} (none is running, or none is connected)"
        elif isinstance(e, NoStreamResponseError):
            why = f"no JetStream stream takes {self._subject} (start a host with --durable)"
        elif isinstance(e, (asyncio.TimeoutError, TimeoutError)) or type(e).__name__ == "TimeoutError":
            why = (f"no answer within {seconds + GRACE_S:g} s: the host that took the call may have died; it may or "
                   "may not have run — retry with the same idempotency_key")
        else:
            why = f"NATS request failed: {type(e).__name__}: {e}"
        return ToolResult.failure(aid, "service_unavailable", why)

    # ---- durable mode: publish to the stream, answers come to our inbox

    async def _listen(self) -> None:
        self._inbox = self._nc.new_inbox()

        async def on_answer(msg: Any) -> None:
            request_id = (msg.headers or {}).get(HDR_REQUEST_ID, "")
            fut = self._waiting.get(request_id)
            if fut is not None and not fut.done():  # a second answer (redelivery) is dropped
                fut.set_result(msg.data)
        await self._nc.subscribe(self._inbox, cb=on_answer)

    async def _durable_call(self, item: Fields) -> ToolResult:
        body = self._request(item)
        if not isinstance(body, bytes):
            return body
        aid, seconds = item[0], item[4]
        while not self._window.take(1):
            if self._closed:
                return ToolResult.failure(aid, "service_unavailable", CLOSED)
            await self._window.room()
        try:
            data = await self._durable_request(body, seconds)
        except asyncio.CancelledError:
            if not self._closed:
                raise
            return ToolResult.failure(aid, "service_unavailable", CLOSED)
        except Exception as e:
            return self._no_answer(aid, e, seconds)
        finally:
            self._window.give()
        try:
            result: ToolResult = _core.decode_response(data, aid)
        except ValueError as e:
            return ToolResult.failure(aid, "parse_error", f"unreadable answer from a NATS host: {e}")
        return result

    async def _durable_request(self, body: bytes, seconds: float) -> bytes:
        request_id = f"{uuid.uuid4().hex}-{next(self._ids)}"
        fut: asyncio.Future[bytes] = self._loop.create_future()
        self._waiting[request_id] = fut
        try:
            await self._js.publish(self._subject, body, headers={HDR_MSG_ID: request_id, HDR_REPLY_TO: self._inbox})
            return await asyncio.wait_for(fut, seconds + GRACE_S + self.redelivery_s)
        finally:
            self._waiting.pop(request_id, None)
