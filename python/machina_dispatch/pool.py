"""The serve-pool transport: persistent ``machina-toolhost --serve`` processes, pipelined.

Each request carries an ``id`` and responses are matched by it, so many calls share one
process. Sync calls read their answers themselves: whichever waiting thread holds a
process's read lock reads for everyone (and hands the lock on when its own answer has
come), so a lone caller pays no thread switch. Asyncio calls go to processes of their own
that the event loop reads. Every process is bounded (``max_in_flight`` requests unanswered
at most; callers beyond that wait), runs in its own process group, and has its stderr
drained into a bounded tail.

When a process dies, every call pending on it fails at once with ``crash`` (its exit
status and stderr tail in the message) and the next call starts a replacement. When a
call gets no answer a grace period after its deadline, the process is taken as wedged:
it is killed, that call fails with ``timeout`` and the others pending on it with
``crash``. :meth:`Pool.close` (also run at interpreter exit, and on SIGTERM when the
default handler was in place) ends every process; none is ever left behind.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import functools
import heapq
import itertools
import os
import select
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from . import _core
from ._locate import NOT_FOUND, check_setup, find_executable
from ._process import HostProcess
from ._result import ToolResult
from ._transport import (
    Call,
    State,
    Transport,
    apply_state,
    call_fields,
    call_texts,
    check_all,
    refuse,
    timeout_ms,
)

__all__ = ["Pool", "Toolhost"]

MAX_LINE_BYTES = 64 * 1024 * 1024  # no response of the host comes near this
READ_CHUNK = 256 * 1024
DEFAULT_SPIN_US = 50  # about what a sleep and a cross-CPU wake-up cost here, several times over
MAX_SPIN_US = 10_000  # the host's --spin-us range
ROUND_TRIP_EOF, ROUND_TRIP_WRITE_FAILED = 1, 3  # _core.round_trip's status (0 done, 2 out of time)


def _failure(aid: str, kind: str, detail: str) -> ToolResult:
    return ToolResult.failure(aid, kind, detail)


class _Entry:
    """One sync call waiting for its answer. `sem` (made only if the caller has to wait
    for another thread to read) is released to wake it: for its answer, or to read."""

    __slots__ = ("aid", "deadline", "lead", "result", "sem", "signalled", "waiting")

    def __init__(self, aid: str, deadline: float) -> None:
        self.aid = aid
        self.deadline = deadline
        self.result: ToolResult | None = None
        self.sem: threading.Lock | None = None
        self.signalled = False
        self.waiting = False
        self.lead = False


# A batch (call_many) waits for its own answers as the reader: it needs no _Entry per
# call. Its calls are pending under one dict of its own, which the reader fills with
# rid -> result; a batch of 100 000 calls thus leaves no 100 000 objects for the cycle
# collector to scan again and again while the batch runs.
_BatchAnswers = dict[int, ToolResult]


class _SyncProcess:
    """A host process read by its sync callers (see the module docstring)."""

    def __init__(self, argv: list[str], env: dict[str, str] | None, max_in_flight: int, grace: float,
                 spin_us: int) -> None:
        self.host = HostProcess(argv, env)
        self.max_in_flight = max_in_flight
        self.grace = grace
        self.spin_us = spin_us
        self.mu = threading.Lock()
        self.room = threading.Condition(self.mu)
        self.read_lock = threading.Lock()
        self.write_lock = threading.Lock()
        self.input_closed = False  # by close(), with the write lock held
        self.pending: dict[int, _Entry | _BatchAnswers] = {}
        self.aids: dict[int, str] = {}
        self.ids = itertools.count(1)
        self.dead: str | None = None  # why, once it is gone
        self.ended = threading.Event()  # fail_all has failed every pending call
        self.buf = b""
        self.room_waiters = 0
        self.readable = select.poll()
        self.readable.register(self.host.fd_out, select.POLLIN)
        self.both = select.poll()
        self.both.register(self.host.fd_out, select.POLLIN)
        self.both.register(self.host.fd_in, select.POLLOUT)

    # --- registering and sending ------------------------------------------------------

    def register(self, aid: str, deadline: float) -> tuple[int, _Entry] | ToolResult:
        with self.mu:
            while self.dead is None and len(self.pending) >= self.max_in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return _failure(aid, "timeout", "no room in the host's request window before the deadline")
                self.room_waiters += 1
                try:
                    self.room.wait(left)
                finally:
                    self.room_waiters -= 1
            if self.dead is not None:
                return _failure(aid, "crash", self.dead)
            rid = next(self.ids)
            entry = _Entry(aid, deadline)
            self.pending[rid] = entry
            self.aids[rid] = aid
            return rid, entry

    def send(self, data: bytes, deadline: float, leading: bool) -> bool:
        """Writes `data`; returns whether this thread now holds the read lock. While a
        write would block, someone must read the host's answers, or it stops reading
        requests: this thread reads if nobody else does.

        One writer at a time: the pipe is non-blocking, so a write longer than its atomic
        size (4 KiB) may go in pieces, and another thread's line must not land between
        them. A reader waiting for its turn to write keeps reading meanwhile: the writer
        ahead of it may be waiting for the host, which waits for its answers to be read."""
        while not self.write_lock.acquire(timeout=0.0 if leading else 0.005):
            if not leading and self.read_lock.acquire(False):
                leading = True
            if leading:
                for _ in self.readable.poll(1):
                    self.read_some()
            if self.gave_up_writing(deadline):
                return leading
        try:
            if self.input_closed or self.dead is not None:
                return leading  # its call is failed by close() / fail_all
            view = memoryview(data)
            while view:
                try:
                    view = view[os.write(self.host.fd_in, view):]
                    continue
                except BlockingIOError:
                    pass
                except OSError:
                    self.fail_all("the host stopped reading requests", None)
                    return leading
                if not leading and self.read_lock.acquire(False):
                    leading = True
                if leading:
                    self.pump(None, deadline, want_write=True)
                else:
                    select.select([], [self.host.fd_in], [], 0.01)
                if self.gave_up_writing(deadline):
                    return leading
            return leading
        finally:
            self.write_lock.release()

    def gave_up_writing(self, deadline: float) -> bool:
        """Whether a writer must stop: the process is gone, or the deadline and grace have
        passed (the host, not reading, is then taken as wedged)."""
        if self.dead is None and time.monotonic() > deadline + self.grace:
            self.wedged(None, "a request could not be written before its deadline")
        return self.dead is not None

    # --- reading ----------------------------------------------------------------------

    def pump(self, entry: _Entry | None, deadline: float, want_write: bool = False,
             batch: tuple[_BatchAnswers, int] | None = None) -> None:
        """With the read lock held: reads and hands out answers until `entry` has its
        own (or the batch's answers hold the given id; or, with want_write, until the host
        can take more input), the deadline plus grace passes, or the process is gone."""
        end = deadline + self.grace
        poller = self.both if want_write else self.readable
        fd_in = self.host.fd_in
        while self.dead is None:
            if entry is not None and entry.result is not None:
                return
            if batch is not None and batch[1] in batch[0]:
                return
            left = end - time.monotonic()
            if left <= 0:
                return
            writable = False
            for fd, _ in poller.poll(left * 1000.0 + 1):
                if fd == fd_in:
                    writable = True
                else:
                    self.read_some()
            if writable:
                return

    def read_some(self) -> None:
        try:
            chunk = os.read(self.host.fd_out, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.fail_all(None, None)  # the process is gone: say how
            return
        self.take(chunk)

    def take(self, chunk: bytes) -> None:
        """Hands out the answers in what was read."""
        buf = self.buf + chunk if self.buf else chunk
        try:
            done, used = _core.decode_responses(buf, 0, self.aids)
        except ValueError as e:
            self.fail_all(f"the host sent an unreadable response ({e}); it was killed", "parse_error", kill=True)
            return
        self.buf = buf[used:]
        if len(self.buf) > MAX_LINE_BYTES:
            self.fail_all(f"a response line passed {MAX_LINE_BYTES} bytes; the host was killed", "parse_error",
                          kill=True)
            return
        if done:
            self.hand_out(done)

    def hand_out(self, done: Iterable[tuple[int, ToolResult]]) -> None:
        """Gives each answer to the call waiting for it."""
        with self.mu:
            for rid, result in done:
                entry = self.pending.pop(rid, None)
                if entry is None:
                    continue  # failed meanwhile by another thread (fail_all): it has its result
                del self.aids[rid]
                if isinstance(entry, dict):
                    entry[rid] = result
                else:
                    entry.result = result
                    if entry.sem is not None:
                        self._signal(entry)
            if self.room_waiters:
                self.room.notify_all()

    def _signal(self, entry: _Entry) -> None:  # with mu held
        if not entry.signalled and entry.sem is not None:
            entry.signalled = True
            entry.sem.release()

    def handoff(self) -> None:
        """After releasing the read lock: wake a waiting caller to read in our place."""
        if not self.pending:
            return
        with self.mu:
            for entry in self.pending.values():
                if isinstance(entry, _Entry) and entry.waiting and entry.result is None:
                    entry.lead = True
                    self._signal(entry)
                    return

    def lead_until(self, done: Callable[[], bool], end: float) -> bool:
        """Takes the read lock, unless `done()` first: whoever holds the lock now may read
        this thread's answer, and a thread blocked on the lock would not see it come."""
        while not done() and self.dead is None:
            left = end - time.monotonic()
            if left <= 0:
                return False
            if self.read_lock.acquire(timeout=min(left, 0.005)):
                return True
        return False

    def wait(self, entry: _Entry, leading: bool) -> ToolResult:
        """Waits for `entry`'s answer, reading for everyone whenever nobody else does."""
        while True:
            if entry.result is not None:
                if leading:
                    self.read_lock.release()
                    self.handoff()
                return entry.result
            if not leading:
                with self.mu:
                    entry.waiting = True
                    if entry.sem is None:
                        entry.sem = threading.Lock()
                        entry.sem.acquire()
                leading = self.read_lock.acquire(False)
            if leading:
                self.pump(entry, entry.deadline)
                if entry.result is None and self.dead is None:
                    self.wedged(entry, f"no answer to a call to {entry.aid} within "
                                       f"{self.grace:g} s after its deadline")
                continue
            left = entry.deadline + self.grace - time.monotonic()
            assert entry.sem is not None
            if not entry.sem.acquire(timeout=max(left, 0)):
                if entry.result is None and self.dead is None:
                    self.wedged(entry, f"no answer to a call to {entry.aid} within "
                                       f"{self.grace:g} s after its deadline")
                continue
            with self.mu:
                entry.signalled = False
                entry.waiting = False
            if entry.lead and entry.result is None:
                entry.lead = False
                leading = self.lead_until(lambda: entry.result is not None, entry.deadline + self.grace)

    # --- failing ----------------------------------------------------------------------

    def wedged(self, entry: _Entry | None, why: str) -> None:
        """The host did not answer in time: kill it; `entry` times out, the rest crash."""
        with self.mu:
            if self.dead is not None:
                return
            if entry is not None and entry.result is None:
                entry.result = _failure(entry.aid, "timeout", f"{why}; the host process was killed")
        self.fail_all(f"the host process was killed: {why}", "crash", kill=True)

    def fail_all(self, why: str | None, kind: str | None, kill: bool = False) -> None:
        """The process is gone (or made to go): every pending call fails at once."""
        if kill:
            self.host.kill()
        with self.mu:
            if self.dead is not None:
                return
            self.dead = "(ending)"
        how = self.host.end(0.5 if not kill else 0.0)
        detail = f"{why}; {how}" if why else how
        with self.mu:
            self.dead = detail
            for rid, entry in self.pending.items():
                if isinstance(entry, dict):
                    entry[rid] = _failure(self.aids[rid], kind or "crash", detail)
                    continue
                if entry.result is None:
                    entry.result = _failure(entry.aid, kind or "crash", detail)
                self._signal(entry)
            self.pending.clear()
            self.aids.clear()
            self.room.notify_all()
        self.ended.set()

    def close(self, wait_s: float) -> None:
        with self.mu:
            if self.dead is not None:
                return
        with self.write_lock:
            self.input_closed = True
            try:
                self.host.close_input()  # the host answers what it has and exits
            except OSError:
                pass
        if self.host.wait_exit(wait_s):
            # Read what is left so that pending calls still get their answers.
            if self.read_lock.acquire(timeout=0.1):
                try:
                    while self.dead is None and self.pending:
                        self.read_some()
                finally:
                    self.read_lock.release()
        self.fail_all("the pool was closed", "crash", kill=True)

    # --- one call, many calls -----------------------------------------------------------

    def call(self, aid: str, input_json: str, key: str | None, token: str | None, ms: int,
             state_json: str | None, deadline: float) -> ToolResult:
        reg = self.register(aid, deadline)
        if isinstance(reg, ToolResult):
            return reg
        rid, entry = reg
        line = _core.encode_request(rid, aid, input_json, key, token, ms, state_json)
        leading = self.read_lock.acquire(False)
        if leading and self.write_lock.acquire(False):
            try:
                self.round_trip(line, deadline, rid, aid)
            except BaseException:
                self.read_lock.release()  # whatever happened, others must still be read for
                self.handoff()
                raise
        else:
            leading = self.send(line, deadline, leading)
        return self.wait(entry, leading)

    def round_trip(self, line: bytes, deadline: float, rid: int, aid: str) -> None:
        """With both locks held and nobody else reading: writes `line` (request `rid`) and
        reads the first answers in one compiled step, without the GIL (the write lock is
        released as soon as the line is written). The usual case, this call's answer
        alone, comes back decoded (not after a partial line left by an earlier read)."""
        if self.input_closed or self.dead is not None:
            self.write_lock.release()
            return
        written, chunk, status, result = _core.round_trip(self.host.fd_in, self.host.fd_out, line,
                                                          deadline + self.grace - time.monotonic(),
                                                          self.write_lock, self.spin_us, -1 if self.buf else rid, aid)
        if result is not None:
            self.hand_out(((rid, result),))
        elif chunk:
            self.take(chunk)
        if status == ROUND_TRIP_EOF:
            self.fail_all(None, None)  # the process is gone: say how
        elif status == ROUND_TRIP_WRITE_FAILED:
            self.fail_all("the host stopped reading requests", None)
        elif written < len(line):
            self.gave_up_writing(deadline)

    def call_batch(self, items: list[tuple[str, str, str | None, str | None, int, str | None]],
                   deadline: float) -> list[ToolResult]:
        """Pipelines many calls: writes while reading, within the request window."""
        answers: _BatchAnswers = {}
        rids: list[int] = []  # of the calls sent, in order
        leading = False
        sent = 0
        first_open = 0  # calls before it have their answers
        try:
            while True:
                while first_open < len(rids) and rids[first_open] in answers:
                    first_open += 1
                if (sent == len(items) and first_open == len(rids)) or self.dead is not None:
                    break
                # Register and send as many as the window allows.
                batch: list[tuple[Any, ...]] = []
                with self.mu:
                    room = self.max_in_flight - len(self.pending) if self.dead is None else 0
                    while sent < len(items) and room > 0:
                        aid, input_json, key, token, ms, state_json = items[sent]
                        rid = next(self.ids)
                        self.pending[rid] = answers
                        self.aids[rid] = aid
                        rids.append(rid)
                        batch.append((rid, aid, input_json, key, token, ms, state_json))
                        sent += 1
                        room -= 1
                if batch:
                    leading = self.send(_core.encode_requests(batch), deadline, leading)
                if time.monotonic() > deadline + self.grace:
                    self.wedged(None, "the batch got no answers within its deadline")
                    break
                if first_open == len(rids):
                    # None of ours is open and the window is full of other callers' calls:
                    # wait for room like them, leaving the reading to them.
                    if leading:
                        self.read_lock.release()
                        leading = False
                        self.handoff()
                    with self.mu:
                        if self.dead is None and len(self.pending) >= self.max_in_flight:
                            self.room_waiters += 1
                            try:
                                self.room.wait(min(max(deadline + self.grace - time.monotonic(), 0), 0.05))
                            finally:
                                self.room_waiters -= 1
                    continue
                if not leading:
                    leading = self.lead_until(functools.partial(answers.__contains__, rids[first_open]),
                                              deadline + self.grace)
                    if not leading:
                        continue  # our answer came through another reader, or time is up (checked above)
                self.pump(None, deadline, batch=(answers, rids[first_open]))
        finally:
            if leading:
                self.read_lock.release()
                self.handoff()
        if len(answers) < len(rids) and self.dead is not None:
            self.ended.wait(5.0)  # the process is being failed: its answers are on their way
        with self.mu:
            got = [answers.get(rid) for rid in rids]
        got += [None] * (len(items) - len(rids))
        return [r if r is not None else _failure(items[i][0], "crash", self.dead or "not sent")
                for i, r in enumerate(got)]

    def load(self) -> int:
        return len(self.pending)


class _Batch:
    """The calls of one ``acall_many`` on one process: sent as the window allows, in
    order, answered through one future."""

    __slots__ = ("items", "deadlines", "sent", "results", "left", "done")

    def __init__(self, items: list[tuple[str, str, str | None, str | None, int, str | None]], deadlines: list[float],
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


class _Queued:
    """One call waiting for room in the request window, its line already encoded."""

    __slots__ = ("rid", "aid", "line", "fut", "state", "check", "deadline", "waiting")

    def __init__(self, rid: int, aid: str, line: bytes, fut: asyncio.Future[ToolResult], state: State | None,
                 check: bool, deadline: float) -> None:
        self.rid, self.aid, self.line, self.fut = rid, aid, line, fut
        self.state, self.check, self.deadline = state, check, deadline
        self.waiting = True


def _settle(fut: asyncio.Future[ToolResult], result: ToolResult, state: State | None, check: bool) -> None:
    """Completes a call's future as ``acall`` promises: state applied, error raised with check."""
    if fut.done():  # cancelled by its caller
        return
    apply_state(state, result)
    if check and not result.ok:
        try:
            result.raise_for_error()
        except Exception as e:  # the ToolhostError subclass for its kind
            fut.set_exception(e)
            return
    fut.set_result(result)


class _AsyncProcess:
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
        self.host = HostProcess(argv, env)
        self.loop = loop
        self.grace = grace
        self.window = max_in_flight
        # rid -> (future, state, check) for one call, (batch, index, None) for a batch's call.
        self.pending: dict[int, tuple[Any, Any, Any]] = {}
        self.aids: dict[int, str] = {}
        self.ids = itertools.count(1)
        self.dead: str | None = None
        self.buf = b""
        self.out = bytearray()
        self.flushing = False  # a flush is scheduled, or the loop waits to write
        self.queue: collections.deque[_Queued | _Batch] = collections.deque()
        # (when, seq, rid, what): rid sent and due by `when` (what None); or a queued call or
        # batch that must be sent by `when`. Entries that come in order of `when` (calls with
        # the same timeout) go in `fifo`; the others in the heap `watch`.
        self.fifo: collections.deque[tuple[float, int, int, _Queued | _Batch | None]] = collections.deque()
        self.watch: list[tuple[float, int, int, _Queued | _Batch | None]] = []
        self.seq = itertools.count()
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = float("inf")
        loop.add_reader(self.host.fd_out, self._on_readable)

    def load(self) -> int:
        return len(self.pending) + len(self.queue)

    # --- calls ---------------------------------------------------------------------------

    def start(self, aid: str, input_json: str, key: str | None, token: str | None, ms: int, state_json: str | None,
              deadline: float, state: State | None, check: bool) -> asyncio.Future[ToolResult]:
        fut: asyncio.Future[ToolResult] = self.loop.create_future()
        if self.dead is not None:
            _settle(fut, _failure(aid, "crash", self.dead), state, check)
            return fut
        rid = next(self.ids)
        line = _core.encode_request(rid, aid, input_json, key, token, ms, state_json)
        if self.queue or len(self.pending) >= self.window:
            q = _Queued(rid, aid, line, fut, state, check, deadline)
            self.queue.append(q)
            self._watch(deadline, rid, q)
            return fut
        self.pending[rid] = (fut, state, check)
        self.aids[rid] = aid
        self._send(line)
        self._watch(deadline + self.grace, rid, None)
        return fut

    def start_many(self, items: list[tuple[str, str, str | None, str | None, int, str | None]],
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
        queue, pending = self.queue, self.pending
        while queue and len(pending) < self.window:
            head = queue[0]
            if isinstance(head, _Queued):
                queue.popleft()
                if not head.waiting or head.fut.done():  # timed out, or cancelled by its caller
                    continue
                head.waiting = False
                pending[head.rid] = (head.fut, head.state, head.check)
                self.aids[head.rid] = head.aid
                self._send(head.line)
                self._watch(head.deadline + self.grace, head.rid, None)
                continue
            if head.done.done():  # cancelled by its caller
                queue.popleft()
                continue
            room = self.window - len(pending)
            first = head.sent
            last = min(first + room, len(head.items))
            chunk = []
            for i in range(first, last):
                aid, input_json, key, token, ms, state_json = head.items[i]
                rid = next(self.ids)
                pending[rid] = (head, i, None)
                self.aids[rid] = aid
                chunk.append((rid, aid, input_json, key, token, ms, state_json))
                self._watch(head.deadlines[i] + self.grace, rid, None)
            head.sent = last
            self._send(_core.encode_requests(chunk))
            if last == len(head.items):
                queue.popleft()

    def _fail_unsent(self, batch: _Batch, kind: str, why: str, until: float | None = None) -> None:
        """Fails the batch's calls not sent yet (those due by `until`, or all)."""
        while batch.sent < len(batch.items) and (until is None or batch.deadlines[batch.sent] <= until):
            batch.give(batch.sent, _failure(batch.items[batch.sent][0], kind, why))
            batch.sent += 1

    def _deliver(self, rid: int, result: ToolResult) -> None:
        target, a, b = self.pending.pop(rid)
        del self.aids[rid]
        if type(target) is _Batch:
            target.give(a, result)
        else:
            _settle(target, result, a, b)

    # --- deadlines -----------------------------------------------------------------------

    def _watch(self, when: float, rid: int, what: _Queued | _Batch | None) -> None:
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
        elif len(fifo) + len(self.watch) > 4 * (len(self.pending) + len(self.queue)) + 4096:
            # Mostly entries of calls long answered: keep them the size of what is open.
            self.fifo = collections.deque(w for w in fifo if self._open(w[2], w[3]))
            self.watch = [w for w in self.watch if self._open(w[2], w[3])]
            heapq.heapify(self.watch)

    def _open(self, rid: int, what: _Queued | _Batch | None) -> bool:
        if what is None:
            return rid in self.pending
        if isinstance(what, _Queued):
            return what.waiting
        return what.sent < len(what.items)

    def _next_due(self) -> tuple[float, int, int, _Queued | _Batch | None] | None:
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
            if isinstance(what, _Queued):
                if what.waiting:
                    what.waiting = False
                    _settle(what.fut, _failure(what.aid, "timeout", "no room in the host's request window before "
                                                                    "the deadline"), what.state, what.check)
            elif isinstance(what, _Batch):
                self._fail_unsent(what, "timeout", "no room in the host's request window before the deadline", now)
                if what.sent < len(what.items):
                    heapq.heappush(self.watch, (what.deadlines[what.sent], next(self.seq), 0, what))
            elif rid in self.pending:
                aid = self.aids[rid]
                self._deliver(rid, _failure(aid, "timeout", f"no answer to a call to {aid} within {self.grace:g} s "
                                                            "after its deadline; the host process was killed"))
                self.fail_all(f"the host process was killed: a call to {aid} got no answer after its deadline",
                              kill=True)
        due = self._first_due()
        if due != float("inf") and self.dead is None:
            self.timer_at = due
            self.timer = self.loop.call_later(max(due - now, 0.0), self._on_timer)

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
        try:
            chunk = os.read(self.host.fd_out, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.fail_all(None)
            return
        buf = self.buf + chunk if self.buf else chunk
        try:
            done, used = _core.decode_responses(buf, 0, self.aids)
        except ValueError as e:
            self.fail_all(f"the host sent an unreadable response ({e}); it was killed", kind="parse_error", kill=True)
            return
        self.buf = buf[used:]
        if len(self.buf) > MAX_LINE_BYTES:
            self.fail_all(f"a response line passed {MAX_LINE_BYTES} bytes; the host was killed", kind="parse_error",
                          kill=True)
            return
        for rid, result in done:
            self._deliver(rid, result)
        if self.queue:
            self._send_queued()

    def fail_all(self, why: str | None, kind: str = "crash", kill: bool = False) -> None:
        if self.dead is not None:
            return
        self.dead = "(ending)"
        try:
            self.loop.remove_reader(self.host.fd_out)
            self.loop.remove_writer(self.host.fd_in)
        except (RuntimeError, ValueError):  # the loop is closed
            pass
        if kill:
            self.host.kill()
        how = self.host.end(0.5 if not kill else 0.0)
        self.dead = f"{why}; {how}" if why else how
        for rid in list(self.pending):
            self._deliver(rid, _failure(self.aids[rid], kind, self.dead))
        while self.queue:  # never sent
            q = self.queue.popleft()
            if isinstance(q, _Batch):
                self._fail_unsent(q, kind, self.dead)
            elif q.waiting:
                q.waiting = False
                _settle(q.fut, _failure(q.aid, kind, self.dead), q.state, q.check)
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


class Pool(Transport):
    """A pool of ``machina-toolhost --serve`` processes (once called ``Toolhost``, a name that
    still works).

    Args:
        processes: how many host processes (sync calls use up to this many; asyncio calls
            as many again, per event loop). Started on first use, restarted when they die.
        workers: ``--workers`` of each process (calls run concurrently inside it).
        executable: the ``machina-toolhost`` to run (found as usual otherwise).
        plugins: plugin libraries to load instead of the built-in pack.
        args: extra command-line options (e.g. ``["--isolation", "process"]``).
        timeout: default deadline in seconds.
        max_in_flight: requests sent to one process but not yet answered, at most;
            more callers wait (backpressure).
        grace: seconds after a call's deadline before its host is taken as wedged.
        close_timeout: seconds :meth:`close` lets processes finish before killing them.
        env: the processes' environment (default: this process's).
        spin_us: microseconds a lone sync caller polls for its answer before sleeping, and
            each host process for its next request (``--spin-us``); a quick tool's answer
            then costs no wake-up on either side. 0 turns spinning off. Neither side spins
            when it may use only one CPU. A ``--spin-us`` in ``args`` overrides it for the
            host processes.

    Raises:
        ExecutableNotFound: no ``machina-toolhost`` executable.
        HostError: the host refuses the set-up (an unknown flag, a plugin that does not
            load): checked once here, by having the host list its tools.
    """

    def __init__(self, processes: int = 1, *, workers: int = 1, executable: str | os.PathLike[str] | None = None,
                 plugins: list[str | os.PathLike[str]] | None = None, args: list[str] | None = None,
                 timeout: float | None = None, max_in_flight: int = 1024, grace: float = 1.0,
                 close_timeout: float = 2.0, env: dict[str, str] | None = None,
                 spin_us: int = DEFAULT_SPIN_US) -> None:
        super().__init__(timeout)
        if processes < 1 or workers < 1 or max_in_flight < 1:
            raise ValueError("processes, workers and max_in_flight must be at least 1")
        if not isinstance(spin_us, int) or not 0 <= spin_us <= MAX_SPIN_US:
            raise ValueError(f"spin_us must be a whole number from 0 to {MAX_SPIN_US}")
        exe = find_executable(executable, loads_plugins=bool(plugins))
        if exe is None:
            from ._errors import ExecutableNotFound

            raise ExecutableNotFound(_failure("", "not_found", NOT_FOUND))
        options = ["--workers", str(workers), "--spin-us", str(spin_us),
                   *[a for p in plugins or [] for a in ("--plugin", os.fspath(p))], *(args or [])]
        check_setup(exe, options, env)
        # --state-per-call: a call runs with the state it sends, or an empty one, whatever
        # the calls before it on the same process did (no empty state sent with every call).
        self.argv = [exe, "--serve", "--state-per-call", *options]
        self.env = env
        self.processes = processes
        self.max_in_flight = max_in_flight
        self.grace = grace
        self.close_timeout = close_timeout
        self.spin_us = spin_us
        self._default_ms = timeout_ms(self.timeout)
        self._lock = threading.Lock()
        self._sync: list[_SyncProcess | None] = [None] * processes
        self._solo: _AsyncProcess | None = None  # the last loop's process, with processes=1
        self._async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[_AsyncProcess | None]] = (
            weakref.WeakKeyDictionary())
        self._closed = False
        _LIVE.add(self)
        _install_sigterm_cleanup()

    # --- choosing a process --------------------------------------------------------------

    def _sync_process(self) -> _SyncProcess:
        """An idle live process, else a new one in a free slot, else the least loaded."""
        first = self._sync[0]
        if first is not None and first.dead is None and not first.pending and not self._closed:
            return first  # the common case, without the lock
        with self._lock:
            if self._closed:
                raise RuntimeError("the pool is closed")
            best: _SyncProcess | None = None
            free = -1
            for i, p in enumerate(self._sync):
                if p is None or p.dead is not None:
                    free = i if free < 0 else free
                elif best is None or p.load() < best.load():
                    best = p
            if best is None or (best.load() > 0 and free >= 0):
                best = self._sync[free] = self._new_sync_process()
            return best

    def _new_sync_process(self) -> _SyncProcess:
        return _SyncProcess(self.argv, self.env, self.max_in_flight, self.grace, self.spin_us)

    def _async_processes(self, n: int) -> list[_AsyncProcess]:
        """The `n` least loaded live processes of this loop (started where needed)."""
        self._async_process()  # replaces dead ones
        loop = asyncio.get_running_loop()
        with self._lock:
            procs = [p for p in self._async.get(loop, []) if p is not None]
        return sorted(procs, key=_AsyncProcess.load)[:n]

    def _async_process(self) -> _AsyncProcess:
        loop = asyncio.get_running_loop()
        solo = self._solo  # one process: no choice to make, no lock to take
        if solo is not None and solo.loop is loop and solo.dead is None and not self._closed:
            return solo
        with self._lock:
            if self._closed:
                raise RuntimeError("the pool is closed")
            procs = self._async.setdefault(loop, [None] * self.processes)
            best: _AsyncProcess | None = None
            for i, p in enumerate(procs):
                if p is None or p.dead is not None:
                    p = procs[i] = _AsyncProcess(self.argv, self.env, self.max_in_flight, self.grace, loop)
                if best is None or p.load() < best.load():
                    best = p
            assert best is not None
            if self.processes == 1:
                self._solo = best
            return best

    # --- calls ---------------------------------------------------------------------------

    def _prepare(self, aid: str, inputs: Any, state: State | None, timeout: float | None,
                 now: float | None = None) -> tuple[str, int, str | None, float] | ToolResult:
        """A call's input text, timeout, state text and deadline; or the failure that
        refuses it before sending."""
        texts = call_texts(aid, inputs, state)
        if isinstance(texts, ToolResult):
            return texts
        input_json, state_json = texts
        ms = self._default_ms if timeout is None else timeout_ms(timeout)
        # A call without a state sends none: the host processes run with --state-per-call,
        # so it runs with an empty one, whatever the calls before it did.
        return input_json, ms, state_json, (time.monotonic() if now is None else now) + ms / 1000.0

    def _prepare_batch(self, calls: Iterable[Call | tuple[Any, ...] | str]) -> tuple[
            list[tuple[str, str, str | None, str | None, int, str | None]], list[float], list[tuple[int, State]],
            dict[int, ToolResult]]:
        """A batch's requests and their deadlines, the calls that carry a state, and the
        calls refused before sending (both by their index in the batch)."""
        prepared: list[tuple[str, str, str | None, str | None, int, str | None]] = []
        deadlines: list[float] = []
        states: list[tuple[int, State]] = []
        refused: dict[int, ToolResult] = {}
        now = time.monotonic()  # one clock read for the batch
        for i, c in enumerate(calls):
            aid, inputs, key, token, timeout, state = call_fields(c)
            ready = self._prepare(aid, inputs, state, timeout, now)
            if isinstance(ready, ToolResult):
                refused[i] = ready
                continue
            if state is not None:
                states.append((i, state))
            input_json, ms, state_json, d = ready
            prepared.append((aid, input_json, key, token, ms, state_json))
            deadlines.append(d)
        return prepared, deadlines, states, refused

    def _finish_batch(self, sent: list[ToolResult], states: list[tuple[int, State]], refused: dict[int, ToolResult],
                      check: bool) -> list[ToolResult]:
        """The batch's results in its order, states updated; raises the first failure with ``check``."""
        if refused:
            answers = iter(sent)
            sent = [refused[i] if i in refused else next(answers) for i in range(len(sent) + len(refused))]
        for i, state in states:
            apply_state(state, sent[i])
        return check_all(sent) if check else sent

    def call(self, aid: str, inputs: Any = None, *, state: State | None = None,
             idempotency_key: str | None = None, lease_token: str | None = None,
             timeout: float | None = None, check: bool = True) -> ToolResult:
        """See :meth:`Transport.call`.

        Raises:
            ToolhostError: with ``check``, the subclass for the failure's kind.
        """
        ready = self._prepare(aid, inputs, state, timeout)
        if isinstance(ready, ToolResult):
            return refuse(ready, check)
        input_json, ms, state_json, deadline = ready
        r = self._sync_process().call(aid, input_json, idempotency_key, lease_token, ms, state_json, deadline)
        apply_state(state, r)
        if check and not r.ok:
            r.raise_for_error()
        return r

    def acall(self, aid: str, inputs: Any = None, *, state: State | None = None,
              idempotency_key: str | None = None, lease_token: str | None = None,
              timeout: float | None = None, check: bool = True) -> asyncio.Future[ToolResult]:
        """See :meth:`Transport.acall`; read by the running event loop, no threads. Returns
        a future (await it, or hand it to ``asyncio.gather``): a call costs no task.

        Raises:
            ToolhostError: (from the await) with ``check``, the subclass for the failure's kind.
        """
        try:
            ready = self._prepare(aid, inputs, state, timeout)
            if isinstance(ready, ToolResult):
                fut: asyncio.Future[ToolResult] = asyncio.get_running_loop().create_future()
                _settle(fut, ready, None, check)
                return fut
            input_json, ms, state_json, deadline = ready
            proc = self._async_process()
        except Exception as e:  # raised where it is awaited, as from a coroutine
            fut = asyncio.get_running_loop().create_future()
            fut.set_exception(e)
            return fut
        return proc.start(aid, input_json, idempotency_key, lease_token, ms, state_json, deadline, state, check)

    def call_many(self, calls: Iterable[Call | tuple[Any, ...] | str], *, check: bool = True) -> list[ToolResult]:
        """Pipelines the calls over the pool's processes (one writer-reader per process);
        results in order.

        Raises:
            ToolhostError: with ``check``, for the first failed call (all calls still ran).
        """
        prepared, deadlines, states, refused = self._prepare_batch(calls)
        if not prepared:
            return self._finish_batch([], states, refused, check)
        deadline = max(deadlines)
        with self._lock:
            if self._closed:
                raise RuntimeError("the pool is closed")
        chunks = min(self.processes, len(prepared))
        if chunks == 1:
            results = self._sync_process().call_batch(prepared, deadline)
        else:
            with self._lock:
                for i, p in enumerate(self._sync):
                    if p is None or p.dead is not None:
                        self._sync[i] = self._new_sync_process()
                procs = [p for p in self._sync if p is not None]
            parts: list[list[ToolResult]] = [[] for _ in range(chunks)]

            def run(k: int) -> None:
                parts[k] = procs[k].call_batch(prepared[k::chunks], deadline)

            threads = [threading.Thread(target=run, args=(k,)) for k in range(1, chunks)]
            for t in threads:
                t.start()
            run(0)
            for t in threads:
                t.join()
            results = [parts[i % chunks][i // chunks] for i in range(len(prepared))]
        return self._finish_batch(results, states, refused, check)

    async def acall_many(self, calls: Iterable[Call | tuple[Any, ...] | str], *,
                         check: bool = True) -> list[ToolResult]:
        """:meth:`call_many` for asyncio: the calls are shared out between this loop's
        processes and pipelined, one future per process for its share.

        Raises:
            ToolhostError: with ``check``, for the first failed call (all calls still ran).
        """
        prepared, deadlines, states, refused = self._prepare_batch(calls)
        if not prepared:
            return self._finish_batch([], states, refused, check)
        procs = self._async_processes(min(self.processes, len(prepared)))
        if len(procs) == 1:
            results = await procs[0].start_many(prepared, deadlines)
        else:
            n = len(procs)
            parts = await asyncio.gather(*(p.start_many(prepared[k::n], deadlines[k::n]) for k, p in enumerate(procs)))
            results = [parts[i % n][i // n] for i in range(len(prepared))]
        return self._finish_batch(results, states, refused, check)

    def close(self) -> None:
        """Ends every host process: they answer what they have, then are killed after
        ``close_timeout``. Pending calls that got no answer fail with ``crash``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            sync = [p for p in self._sync if p is not None]
            asyncs = [p for procs in list(self._async.values()) for p in procs if p is not None]
        for p in sync:
            p.close(self.close_timeout)
        for a in asyncs:
            a.close()
        _LIVE.discard(self)

    async def aclose(self) -> None:
        """:meth:`close` from asyncio (fails this loop's pending calls properly)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            procs = [p for p in self._async.get(loop, []) if p is not None]
        for a in procs:
            a.fail_all("the pool was closed", kill=True)
        await loop.run_in_executor(None, self.close)

    def pids(self) -> list[int]:
        """The process ids of the live host processes (for monitoring and tests)."""
        with self._lock:
            procs: list[_SyncProcess | _AsyncProcess | None] = [*self._sync]
            for ps in self._async.values():
                procs.extend(ps)
        return [p.host.pid for p in procs if p is not None and p.dead is None]


Toolhost = Pool  # the earlier name

_LIVE: weakref.WeakSet[Pool] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for pool in list(_LIVE):
        pool.close()


_sigterm_installed = False


def _install_sigterm_cleanup() -> None:
    """On SIGTERM (when nobody else handles it), kill every pool's processes, then die
    of SIGTERM as before. Only the main thread can install signal handlers."""
    global _sigterm_installed
    if _sigterm_installed or threading.current_thread() is not threading.main_thread():
        return
    _sigterm_installed = True
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def on_sigterm(signum: int, frame: object) -> None:
        for pool in list(_LIVE):
            with pool._lock:
                procs = [p for p in pool._sync if p is not None]
                procs_a = [p for ps in pool._async.values() for p in ps if p is not None]
            for host in [p.host for p in procs] + [p.host for p in procs_a]:
                host.kill()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)
