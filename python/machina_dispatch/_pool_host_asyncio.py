"""A pooled host process read by one asyncio event loop.

A call is a future the reader completes; requests are written once per loop iteration;
calls beyond the request window wait, encoded, in an ordered queue; one timer watches every
deadline. What is shared with the threaded driver (the process, request ids, response
matching, how a host ends) is in :mod:`machina_dispatch._pool_host`.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import os
import time
from collections.abc import Iterable
from typing import Any

from . import _core
from ._pool_host import PoolHost, Prepared
from ._result import ToolResult
from ._transport import State, apply_state

__all__ = ["AsyncioPoolHost", "settle"]


class _Batch:
    """The calls of one ``acall_many`` on one process: sent as the window allows, in
    order, answered through one future."""

    __slots__ = ("items", "deadlines", "sent", "results", "left", "done")

    def __init__(self, items: list[Prepared], deadlines: list[float],
                 done: asyncio.Future[list[ToolResult]]) -> None:
        self.items = items
        self.deadlines = deadlines
        self.sent = 0  # items before it were sent (or failed unsent)
        self.results: list[ToolResult | None] = [None] * len(items)
        self.left = len(items)
        self.done = done

    def give(self, i: int, result: ToolResult) -> None:
        if self.results[i] is None:
            self.results[i] = result
            self.left -= 1
            if self.left == 0 and not self.done.done():
                self.done.set_result(self.results)  # type: ignore[arg-type]  # all set by now


class _Sent:
    """Calls of a batch sent together (consecutive ids), watched by one entry: due at the
    earliest deadline among them plus the grace period."""

    __slots__ = ("batch", "count", "first", "first_rid")

    def __init__(self, batch: _Batch, first_rid: int, first: int, count: int) -> None:
        self.batch, self.first_rid, self.first, self.count = batch, first_rid, first, count

    def open_rids(self, pending: dict[int, Any]) -> Iterable[tuple[int, float]]:
        """(rid, deadline) of the calls still unanswered."""
        deadlines = self.batch.deadlines
        for k in range(self.count):
            if self.first_rid + k in pending:
                yield self.first_rid + k, deadlines[self.first + k]


# One call waiting for room in the request window, its line already encoded: (rid, aid,
# line, future, state, check, deadline). A tuple, as cheap as a queued call can be: one
# whose future is done (timed out in the queue, cancelled by its caller) is dropped
# unsent, and its one watch entry (at its deadline) serves it queued and sent alike.
_Queued = tuple[int, str, bytes, "asyncio.Future[ToolResult]", "State | None", bool, float]


def settle(fut: asyncio.Future[ToolResult], result: ToolResult, state: State | None, check: bool) -> None:
    """Completes a call's future as ``acall`` promises: state applied, error raised with check."""
    if fut.done():  # cancelled by its caller
        return
    if state is not None:
        apply_state(state, result)
    if check and not result.ok:
        try:
            result.raise_for_error()
        except Exception as e:  # the ToolhostError subclass for its kind
            fut.set_exception(e)
            return
    fut.set_result(result)


class AsyncioPoolHost(PoolHost):
    """A host process read by one asyncio event loop.

    A call is a future, not a task: ``acall`` encodes the request, appends it to the output
    buffer and returns the future, which the reader completes. Requests are written once per
    loop iteration however many calls queued them, and responses decoded a read at a time.
    Calls beyond the request window wait, encoded, in a queue sent in order as answers free
    room. One timer watches the earliest deadline: a call still queued at its deadline fails
    with ``timeout``; a call unanswered ``grace`` seconds past it means the host is wedged,
    and it is killed.
    """

    def __init__(self, argv: list[str], env: dict[str, str] | None, max_in_flight: int, grace: float,
                 loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(argv, env, grace)
        self.loop = loop
        self.window = max_in_flight
        # rid -> (future, state, check) for one call, (batch, index, None) for a batch's call.
        self.pending: dict[int, tuple[Any, Any, Any]] = {}
        self.out = bytearray()
        self.flushing = False  # a flush is scheduled, or the loop waits to write
        self.queue: collections.deque[_Queued | _Batch] = collections.deque()
        # (when, seq, rid, what): rid sent and due by `when` (what None); or a queued call or
        # batch that must be sent by `when`. Entries that come in order of `when` (calls with
        # the same timeout) go in `fifo`; the others in the heap `watch`.
        self.fifo: collections.deque[tuple[float, int, int, _Queued | _Batch | _Sent | None]] = collections.deque()
        self.watch: list[tuple[float, int, int, _Queued | _Batch | _Sent | None]] = []
        self.seq = itertools.count()
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = float("inf")
        loop.add_reader(self.host.fd_out, self._on_readable)

    def load(self) -> int:
        return len(self.pending) + len(self.queue)

    # --- calls ---------------------------------------------------------------------------

    def start(self, aid: str, input_json: str, key: str | None, token: str | None, ms: int, state_json: str | None,
              deadline: float, state: State | None, check: bool, user: str | None = None) -> asyncio.Future[ToolResult]:
        fut: asyncio.Future[ToolResult] = self.loop.create_future()
        if self.dead is not None:
            settle(fut, ToolResult.failure(aid, "crash", self.dead), state, check)
            return fut
        rid = next(self.ids)
        line = _core.encode_request(rid, aid, input_json, key, token, ms, state_json, user)
        if self.queue or len(self.pending) >= self.window:
            q = (rid, aid, line, fut, state, check, deadline)
            self.queue.append(q)
            self._watch_soon(deadline, rid, q)
            return fut
        self.pending[rid] = (fut, state, check)
        self.aids[rid] = aid
        self._send(line)
        self._watch_soon(deadline + self.grace, rid, None)
        return fut

    def start_many(self, items: list[Prepared],
                   deadlines: list[float]) -> asyncio.Future[list[ToolResult]]:
        batch = _Batch(items, deadlines, self.loop.create_future())
        if self.dead is not None:
            self._fail_unsent(batch, "crash", self.dead)
            return batch.done
        self.queue.append(batch)
        self._send_queued()
        if batch.sent < len(items):
            self._watch(deadlines[batch.sent], 0, batch)
        return batch.done

    def _send(self, data: bytes) -> None:
        self.out += data
        if not self.flushing:
            self.flushing = True
            self.loop.call_soon(self._flush)

    def _send_queued(self) -> None:
        """Sends what waits in the queue, in order, while the window has room."""
        queue, pending, aids, out = self.queue, self.pending, self.aids, self.out
        sent = len(out)
        while queue and len(pending) < self.window:
            head = queue[0]
            if isinstance(head, tuple):
                queue.popleft()
                rid, aid, line, fut, state, check, _ = head
                if fut.done():  # timed out, or cancelled by its caller
                    continue
                pending[rid] = (fut, state, check)
                aids[rid] = aid
                out += line  # watched still by its entry at its deadline (_on_timer)
                continue
            if head.done.done():  # cancelled by its caller
                queue.popleft()
                continue
            room = self.window - len(pending)
            first = head.sent
            last = min(first + room, len(head.items))
            chunk = []
            for i in range(first, last):
                aid, input_json, key, token, ms, state_json, user = head.items[i]
                rid = next(self.ids)
                pending[rid] = (head, i, None)
                self.aids[rid] = aid
                chunk.append((rid, aid, input_json, key, token, ms, state_json, user))
            head.sent = last
            self._send(_core.encode_requests(chunk))
            self._watch(min(head.deadlines[first:last]) + self.grace, chunk[0][0],
                        _Sent(head, chunk[0][0], first, last - first))
            if last == len(head.items):
                queue.popleft()
        if len(out) > sent and not self.flushing:
            self.flushing = True
            self.loop.call_soon(self._flush)

    def _fail_unsent(self, batch: _Batch, kind: str, why: str, until: float | None = None) -> None:
        """Fails the batch's calls not sent yet (those due by `until`, or all)."""
        while batch.sent < len(batch.items) and (until is None or batch.deadlines[batch.sent] <= until):
            batch.give(batch.sent, ToolResult.failure(batch.items[batch.sent][0], kind, why))
            batch.sent += 1

    def _deliver(self, rid: int, result: ToolResult) -> None:
        target, a, b = self.pending.pop(rid)
        del self.aids[rid]
        if type(target) is _Batch:
            target.give(a, result)
        else:
            settle(target, result, a, b)

    # --- deadlines -----------------------------------------------------------------------

    def _watch_soon(self, when: float, rid: int, what: _Queued | _Batch | _Sent | None) -> None:
        """_watch, for the usual case first: due no sooner than the last entry and the timer."""
        fifo = self.fifo
        if fifo and when >= fifo[-1][0] and when >= self.timer_at:
            fifo.append((when, 0, rid, what))
        else:
            self._watch(when, rid, what)

    def _watch(self, when: float, rid: int, what: _Queued | _Batch | _Sent | None) -> None:
        fifo = self.fifo
        if not fifo or when >= fifo[-1][0]:
            fifo.append((when, 0, rid, what))
        else:
            heapq.heappush(self.watch, (when, next(self.seq), rid, what))
        if when < self.timer_at:
            if self.timer is not None:
                self.timer.cancel()
            self.timer_at = when
            self.timer = self.loop.call_later(max(when - time.monotonic(), 0.0), self._on_timer)

    def _compact(self) -> None:
        """Keeps the watch entries the size of what is open (checked after every read):
        most are of calls long answered, due only at their deadlines."""
        if len(self.fifo) + len(self.watch) > 4 * (len(self.pending) + len(self.queue)) + 4096:
            self.fifo = collections.deque(w for w in self.fifo if self._open(w[2], w[3]))
            self.watch = [w for w in self.watch if self._open(w[2], w[3])]
            heapq.heapify(self.watch)

    def _open(self, rid: int, what: _Queued | _Batch | _Sent | None) -> bool:
        if what is None:
            return rid in self.pending
        if isinstance(what, tuple):
            return rid in self.pending or not what[3].done()
        if isinstance(what, _Sent):
            return any(True for _ in what.open_rids(self.pending))
        return what.sent < len(what.items)

    def _next_due(self) -> tuple[float, int, int, _Queued | _Batch | _Sent | None] | None:
        """Takes the entry due first out of the fifo and the heap (None when both are empty)."""
        fifo, heap = self.fifo, self.watch
        if fifo and (not heap or fifo[0][0] <= heap[0][0]):
            return fifo.popleft()
        return heapq.heappop(heap) if heap else None

    def _first_due(self) -> float:
        first = self.fifo[0][0] if self.fifo else float("inf")
        return min(first, self.watch[0][0]) if self.watch else first

    def _on_timer(self) -> None:
        self.timer = None
        self.timer_at = float("inf")
        now = time.monotonic()
        while self._first_due() <= now and self.dead is None:
            entry = self._next_due()
            assert entry is not None
            _, _, rid, what = entry
            if isinstance(what, tuple):  # a call that was queued, at its deadline
                if rid in self.pending:  # sent since: it has the grace period to be answered
                    heapq.heappush(self.watch, (what[6] + self.grace, next(self.seq), rid, None))
                else:  # still queued (settle leaves an answered or cancelled call alone)
                    why = "no room in the host's request window before the deadline"
                    settle(what[3], ToolResult.failure(what[1], "timeout", why), what[4], what[5])
            elif isinstance(what, _Batch):
                self._fail_unsent(what, "timeout", "no room in the host's request window before the deadline", now)
                if what.sent < len(what.items):
                    heapq.heappush(self.watch, (what.deadlines[what.sent], next(self.seq), 0, what))
            elif isinstance(what, _Sent):
                due = float("inf")
                for open_rid, deadline in what.open_rids(self.pending):
                    if deadline + self.grace <= now:
                        self._overdue(open_rid)
                        break
                    due = min(due, deadline + self.grace)
                else:
                    if due != float("inf"):
                        heapq.heappush(self.watch, (due, next(self.seq), rid, what))
            elif rid in self.pending:
                self._overdue(rid)
        due = self._first_due()
        if due != float("inf") and self.dead is None:
            self.timer_at = due
            self.timer = self.loop.call_later(max(due - now, 0.0), self._on_timer)

    def _overdue(self, rid: int) -> None:
        """Call `rid` is unanswered `grace` seconds after its deadline: the host is wedged."""
        aid = self.aids[rid]
        self._deliver(rid, ToolResult.failure(aid, "timeout", f"no answer to a call to {aid} within {self.grace:g} s "
                                                    "after its deadline; the host process was killed"))
        self.fail_all(f"the host process was killed: a call to {aid} got no answer after its deadline", kill=True)

    # --- the pipes -----------------------------------------------------------------------

    def _flush(self) -> None:
        if self.dead is not None:
            self.flushing = False
            return
        try:
            n = os.write(self.host.fd_in, self.out)
        except BlockingIOError:
            n = 0
        except OSError:
            self.flushing = False
            self.fail_all("the host stopped reading requests")
            return
        del self.out[:n]
        if self.out:
            self.loop.add_writer(self.host.fd_in, self._on_writable)  # `flushing` stays set
        else:
            self.flushing = False

    def _on_writable(self) -> None:
        try:
            n = os.write(self.host.fd_in, self.out)
        except BlockingIOError:
            return
        except OSError:
            self.fail_all("the host stopped reading requests")
            return
        del self.out[:n]
        if not self.out:
            self.loop.remove_writer(self.host.fd_in)
            self.flushing = False

    def _on_readable(self) -> None:
        chunk = self.read()
        if chunk is None:
            return
        done = self.decode(chunk)
        if done is None:
            return
        for rid, result in done:
            self._deliver(rid, result)
        if self.queue:
            self._send_queued()
        self._compact()

    def fail_all(self, why: str | None, kind: str = "crash", kill: bool = False) -> None:
        if self.dead is not None:
            return
        self.dead = "(ending)"
        try:
            self.loop.remove_reader(self.host.fd_out)
            self.loop.remove_writer(self.host.fd_in)
        except (RuntimeError, ValueError):  # the loop is closed
            pass
        self.dead = self.end_host(why, kill)
        for rid in list(self.pending):
            self._deliver(rid, ToolResult.failure(self.aids[rid], kind, self.dead))
        while self.queue:  # never sent
            q = self.queue.popleft()
            if isinstance(q, _Batch):
                self._fail_unsent(q, kind, self.dead)
            else:
                settle(q[3], ToolResult.failure(q[1], kind, self.dead), q[4], q[5])
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.watch.clear()
        self.fifo.clear()
        self.out.clear()

    def close(self) -> None:
        """From any thread: ends the host now; its pending calls fail with crash, on their
        loop (futures belong to it), or at once when that loop is this thread's or closed."""
        if self.dead is not None:
            return
        self.host.kill()
        self.host.end(0.0)  # reaped now, whenever the loop runs again
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not self.loop:
            try:
                self.loop.call_soon_threadsafe(self.fail_all, "the pool was closed", "crash", True)
                return
            except RuntimeError:  # that loop is closed: nobody awaits these futures
                pass
        self.fail_all("the pool was closed", "crash", True)
