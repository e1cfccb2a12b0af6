"""The NATS transport's own machinery against a real nats-server and a responder that plays a
host: the in-flight cap, one result per call whatever the responder sends, deadlines swept
per call, no responders, a cancelled batch and a close with calls still out."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import machina_dispatch as md
import nats
import orjson
import pytest
from conftest import HANG_GUARD_S, scaled
from machina_dispatch.nats_client import CLOSED, Nats
from nats_support import nats_server


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with nats_server(jetstream=False) as u:
        yield u


def answer(request: bytes) -> bytes:
    """A host's answer to an echo call: the call's input as its output."""
    return orjson.dumps({"ok": True, "status": "OK", "output_json": orjson.loads(request)["input_json"], "error": ""})


class Responder:
    """A nats-py subscriber in the queue group on `PREFIX.call`, on a thread of its own. It
    holds the requests it gets until none has come for `quiet_s` (so that what it holds is
    every request a client has out), answers them `copies` times each — or never, while
    `silent` — and records the most it held at once."""

    def __init__(self, url: str, prefix: str, quiet_s: float = 0.05, copies: int = 1) -> None:
        self.url, self.subject, self.quiet_s, self.copies = url, f"{prefix}.call", quiet_s, copies
        self.silent = False
        self._stopping = False
        self.most_held = 0
        self.seen = 0
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._task = asyncio.run_coroutine_threadsafe(self._serve(), self._loop)
        assert self._ready.wait(5), "the responder did not subscribe"

    async def _serve(self) -> None:
        nc = await nats.connect(self.url)
        held: list[Any] = []
        arrived = asyncio.Event()

        async def on_request(msg: Any) -> None:
            held.append(msg)
            self.seen += 1
            self.most_held = max(self.most_held, len(held))
            arrived.set()
        await nc.subscribe(self.subject, "q", cb=on_request)
        await nc.flush()
        self._ready.set()
        try:
            while not self._stopping:
                arrived.clear()
                try:
                    await asyncio.wait_for(arrived.wait(), self.quiet_s)
                    continue  # still arriving
                except asyncio.TimeoutError:
                    pass
                if held and not self.silent:
                    for msg in held:
                        for _ in range(self.copies):
                            await nc.publish(msg.reply, answer(msg.data))
                    held.clear()
                    await nc.flush()
        finally:
            await nc.close()

    def stop(self) -> None:
        self._stopping = True
        self._task.result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def __enter__(self) -> Responder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def test_never_more_than_max_in_flight_out_and_one_result_per_call(url: str) -> None:
    """A responder that answers every request twice: each call still gets one result, in
    order, and the second answers free no room in the window."""
    with Responder(url, "cap", copies=2) as responder, Nats(url, prefix="cap", timeout=10, max_in_flight=4) as t:
        results = asyncio.run(t.acall_many([("AID.ECHO.v1", {"i": i}) for i in range(40)]))
        assert [r.output_json for r in results] == [f'{{"i":{i}}}' for i in range(40)]
        assert responder.most_held == 4 and responder.seen == 40
        assert [r.output_json for r in t.call_many([("AID.ECHO.v1", [i]) for i in range(9)])] == \
            [f"[{i}]" for i in range(9)]
        assert responder.most_held == 4


def test_concurrent_callers_share_one_window(url: str) -> None:
    with Responder(url, "shared") as responder, Nats(url, prefix="shared", timeout=10, max_in_flight=6) as t:
        async def many() -> list[list[md.ToolResult]]:
            batches = [t.acall_many([("AID.ECHO.v1", [b, i]) for i in range(10)]) for b in range(3)]
            singles = [t.acall("AID.ECHO.v1", ["one", i]) for i in range(5)]
            return list(await asyncio.gather(*batches, asyncio.gather(*singles)))
        got = asyncio.run(many())
        assert [[r.output_json for r in batch] for batch in got[:3]] == \
            [[f"[{b},{i}]" for i in range(10)] for b in range(3)]
        assert [r.output_json for r in got[3]] == [f'["one",{i}]' for i in range(5)]
        assert responder.most_held == 6


def test_each_call_times_out_on_its_own_deadline(url: str) -> None:
    """A silent responder: a call with a short deadline is answered service_unavailable at its
    deadline plus the grace period, though a call with a long one went out before it."""
    with Responder(url, "late") as responder, Nats(url, prefix="late", timeout=30) as t:
        responder.silent = True

        async def both() -> tuple[md.ToolResult, float]:
            long = asyncio.ensure_future(t.acall("AID.ECHO.v1", {"long": 1}, check=False))
            await asyncio.sleep(0.1)
            start = time.monotonic()
            short = await t.acall("AID.ECHO.v1", {"short": 1}, timeout=0.2, check=False)
            took = time.monotonic() - start
            long.cancel()
            return short, took
        short, took = asyncio.run(both())
        assert short.kind == "service_unavailable" and "no answer within 2.2 s" in short.error
        assert 2.1 < took < scaled(HANG_GUARD_S)
        # The silent responder answers at last: the late answers go nowhere, and the next
        # calls are answered as usual.
        responder.silent = False
        time.sleep(0.3)
        assert t.call("AID.ECHO.v1", {"after": 1}).output_json == '{"after":1}'


def test_no_responder_answers_every_call_at_once(url: str) -> None:
    with Nats(url, prefix="nobody-here", timeout=10, max_in_flight=8) as t:
        start = time.monotonic()
        results = t.call_many([("AID.ECHO.v1", {"i": i}) for i in range(50)], check=False)
        assert time.monotonic() - start < scaled(HANG_GUARD_S)  # (the message says which path answered)
        assert {r.kind for r in results} == {"service_unavailable"}
        assert all("no machina-toolhost-nats host serves nobody-here.call" in r.error for r in results)


def test_a_cancelled_batch_gives_back_its_room(url: str) -> None:
    with Responder(url, "cancel") as responder, Nats(url, prefix="cancel", timeout=10, max_in_flight=4) as t:
        responder.silent = True

        async def cancelled() -> None:
            batch = asyncio.ensure_future(t.acall_many([("AID.ECHO.v1", {"i": i}) for i in range(20)]))
            await asyncio.sleep(0.3)
            batch.cancel()
            with pytest.raises(asyncio.CancelledError):
                await batch
        asyncio.run(cancelled())
        assert responder.most_held == 4
        responder.silent = False
        time.sleep(0.2)  # the held requests are answered, to nobody
        # Room not given back would hold this call to its deadline, and fail it.
        assert t.call("AID.ECHO.v1", {"next": 1}).output_json == '{"next":1}'


def test_close_answers_the_calls_still_out(url: str) -> None:
    with Responder(url, "closing") as responder:
        responder.silent = True
        t = Nats(url, prefix="closing", timeout=30)
        got: list[md.ToolResult] = []
        caller = threading.Thread(target=lambda: got.extend(t.call_many([("AID.ECHO.v1", {"i": i})
                                                                        for i in range(3)], check=False)))
        caller.start()
        time.sleep(0.3)
        t.close()
        caller.join(5)
        assert not caller.is_alive(), "a call still out when the transport closed got no result"
        assert [r.kind for r in got] == ["service_unavailable"] * 3
        assert all("closed before the answer came" in r.error for r in got)
        with pytest.raises(RuntimeError, match="closed"):
            t.call("AID.ECHO.v1")


def test_a_bad_timeout_refuses_the_batch_before_anything_is_sent(url: str) -> None:
    """As on every transport, inputs are looked at first: unsendable inputs with a bad
    timeout are an invalid_input result, and a bad timeout alone a ValueError — for a
    batch, before any of its calls is sent."""
    with Responder(url, "badtimeout") as responder, Nats(url, prefix="badtimeout", timeout=10) as t:
        r = t.call("AID.ECHO.v1", {1, 2}, timeout=-1, check=False)
        assert r.kind == "invalid_input" and r.status == "INVALID_PICK", r
        with pytest.raises(ValueError, match="timeout"):
            t.call("AID.ECHO.v1", {}, timeout=-1, check=False)
        calls = [md.Call("AID.ECHO.v1", {"i": i}) for i in range(50)] + [md.Call("AID.ECHO.v1", {}, timeout=0)]
        with pytest.raises(ValueError, match="timeout"):
            asyncio.run(t.acall_many(calls))
        with pytest.raises(ValueError, match="timeout"):
            t.call_many(calls)
        time.sleep(0.2)
        assert responder.seen == 0
        results = t.call_many([md.Call("AID.ECHO.v1", {"i": 1}), md.Call("AID.ECHO.v1", {3, 4}, timeout=-1)],
                              check=False)
        assert results[0].output_json == '{"i":1}' and results[1].kind == "invalid_input"


def test_close_answers_durable_calls_waiting_for_room() -> None:
    """Durable calls, one out (a stream takes it, no host answers) and two waiting for room:
    close answers all three as closed."""
    with nats_server() as url:
        async def stream() -> None:
            nc = await nats.connect(url)
            await nc.jetstream().add_stream(name="HELD_CALLS", subjects=["held.durable.call"])
            await nc.close()
        asyncio.run(stream())
        t = Nats(url, prefix="held", durable=True, timeout=30, max_in_flight=1)
        got: list[md.ToolResult] = []
        caller = threading.Thread(
            target=lambda: got.extend(t.call_many([("AID.ECHO.v1", {"i": i}) for i in range(3)], check=False)))
        caller.start()
        time.sleep(0.5)
        t.close()
        caller.join(5)
        assert not caller.is_alive()
        assert [(r.kind, r.error) for r in got] == [("service_unavailable", CLOSED)] * 3
