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
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import uuid
from collections.abc import Awaitable, Iterable
from concurrent.futures import Future
from typing import Any

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
from ._transport import Call, State, Transport, apply_state, call_fields, call_texts, check_all, refuse, timeout_ms

__all__ = ["Nats"]

GRACE_S = 2.0  # past the call's deadline, how long to wait for the host's own timeout answer
CONNECT_TIMEOUT_S = 5.0


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
        self._window = asyncio.Semaphore(max_in_flight)  # (used on self._loop only)
        self._waiting: dict[str, asyncio.Future[bytes]] = {}
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
                asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(CONNECT_TIMEOUT_S)
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
        results = self._submit_many(calls).result()
        return check_all(results) if check else results

    async def acall_many(self, calls: Iterable[Call | tuple[Any, ...] | str], *,
                         check: bool = True) -> list[ToolResult]:
        results = await asyncio.wrap_future(self._submit_many(calls))
        return check_all(results) if check else results

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

    # ---- the calls, on the transport's loop

    def _submit(self, aid: str, inputs: Any, state: State | None, key: str | None, lease: str | None,
                timeout: float | None, check: bool, user: str | None = None) -> Future[ToolResult]:
        if self._closed:
            raise RuntimeError("the NATS transport is closed")
        texts = call_texts(aid, inputs, state)
        if isinstance(texts, ToolResult):
            done: Future[ToolResult] = Future()
            try:
                done.set_result(refuse(texts, check))
            except Exception as e:
                done.set_exception(e)
            return done

        async def run() -> ToolResult:
            result = await self._one(aid, texts[0], texts[1], key, lease, timeout, user)
            apply_state(state, result)
            return result.raise_for_error() if check else result
        return asyncio.run_coroutine_threadsafe(run(), self._loop)

    def _submit_many(self, calls: Iterable[Call | tuple[Any, ...] | str]) -> Future[list[ToolResult]]:
        if self._closed:
            raise RuntimeError("the NATS transport is closed")
        items = [call_fields(c) for c in calls]

        async def run() -> list[ToolResult]:
            async def one(aid: str, inputs: Any, key: str | None, lease: str | None, timeout: float | None,
                          state: State | None, user: str | None) -> ToolResult:
                texts = call_texts(aid, inputs, state)
                if isinstance(texts, ToolResult):
                    return texts
                result = await self._one(aid, texts[0], texts[1], key, lease, timeout, user)
                apply_state(state, result)
                return result
            return list(await asyncio.gather(*(one(*item) for item in items)))
        return asyncio.run_coroutine_threadsafe(run(), self._loop)

    async def _one(self, aid: str, input_json: str, state_json: str | None, key: str | None, lease: str | None,
                   timeout: float | None, user: str | None = None) -> ToolResult:
        seconds = self.timeout if timeout is None else float(timeout)
        envelope: dict[str, Any] = {"aid": aid, "input_json": input_json, "timeout_ms": timeout_ms(seconds)}
        if key is not None:
            envelope["idempotency_key"] = key
        if user is not None:
            envelope["user"] = user
        if lease is not None:
            envelope["_lease_token"] = lease
        body = orjson.dumps(envelope)
        if state_json is not None:  # already JSON text: spliced in, not parsed again
            body = body[:-1] + b',"ds_state":' + state_json.encode() + b"}"
        if len(body) > self._nc.max_payload:
            return ToolResult.failure(aid, "request_too_large", f"request of {len(body)} bytes exceeds the NATS "
                                      f"server's max_payload of {self._nc.max_payload} bytes", status="INVALID_PICK")
        try:
            async with self._window:
                data = await (self._durable_request(body, seconds) if self.durable else self._request(body, seconds))
        except Exception as e:
            return self._no_answer(aid, e, seconds)
        try:
            result: ToolResult = _core.decode_response(data, aid)
        except ValueError as e:
            return ToolResult.failure(aid, "parse_error", f"unreadable answer from a NATS host: {e}")
        return result

    async def _request(self, body: bytes, seconds: float) -> bytes:
        msg = await self._nc.request(self._subject, body, timeout=seconds + GRACE_S)
        data: bytes = msg.data
        return data

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
        elif isinstance(e, asyncio.CancelledError):
            why = "the NATS transport was closed before the answer came"
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

    async def _durable_request(self, body: bytes, seconds: float) -> bytes:
        request_id = f"{uuid.uuid4().hex}-{next(self._ids)}"
        fut: asyncio.Future[bytes] = self._loop.create_future()
        self._waiting[request_id] = fut
        try:
            await self._js.publish(self._subject, body, headers={HDR_MSG_ID: request_id, HDR_REPLY_TO: self._inbox})
            return await asyncio.wait_for(fut, seconds + GRACE_S + self.redelivery_s)
        finally:
            self._waiting.pop(request_id, None)
