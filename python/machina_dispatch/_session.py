"""One NDJSON client session with a ``--serve`` host process, and its two drivers.

A :class:`Session` owns the host process (:class:`~machina_dispatch._process.HostProcess`),
numbers the requests it sends, matches the responses to them (``_core.decode_responses``)
and fails every call open on it, at once, when the host dies or is taken as wedged. Two
drivers move the bytes:

* :class:`SyncSession` — read by its sync callers: whichever waiting thread holds the read
  lock reads for everyone (and hands the lock on when its own answer has come), so a lone
  caller pays no thread switch; a lone caller's write and read are one compiled step
  (``_core.round_trip``, the GIL released).
* :class:`AsyncSession` — read by one asyncio event loop: a call is a future the reader
  completes; requests are written once per loop iteration; calls beyond the request window
  wait, encoded, in an ordered queue; one timer watches every deadline.

Both are bounded (``max_in_flight`` requests unanswered at most; callers beyond that wait)
and both apply the same rules: a host that dies fails its calls with ``crash`` (exit status
and stderr tail in the message); a call unanswered ``grace`` seconds after its deadline
means the host is wedged: it is killed, that call fails with ``timeout``, the others with
``crash``.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import heapq
import itertools
import os
import select
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from . import _core
from ._process import HostProcess
from ._result import ToolResult
from ._transport import State, apply_state

__all__ = ["AsyncSession", "Session", "SyncSession", "settle"]

MAX_LINE_BYTES = 64 * 1024 * 1024  # no response of the host comes near this
READ_CHUNK = 256 * 1024
ROUND_TRIP_EOF, ROUND_TRIP_WRITE_FAILED = 1, 3  # _core.round_trip's status (0 done, 2 out of time)


def _failure(aid: str, kind: str, detail: str) -> ToolResult:
    return ToolResult.failure(aid, kind, detail)


#: A call ready to send: (aid, input_json, idempotency_key, lease_token, timeout_ms,
#: ds_state_json, user).
Prepared = tuple[str, str, str | None, str | None, int, str | None, str | None]


class Session:
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


class SyncSession(Session):
    """A host process read by its sync callers (see the module docstring)."""

    def __init__(self, argv: list[str], env: dict[str, str] | None, max_in_flight: int, grace: float,
                 spin_us: int) -> None:
        super().__init__(argv, env, grace)
        self.max_in_flight = max_in_flight
        self.spin_us = spin_us
        self.mu = threading.Lock()
        self.room = threading.Condition(self.mu)
        self.read_lock = threading.Lock()
        self.write_lock = threading.Lock()
        self.input_closed = False  # by close(), with the write lock held
        self.pending: dict[int, _Entry | _BatchAnswers] = {}
        self.ended = threading.Event()  # fail_all has failed every pending call
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
                    self.fail_all("the host stopped reading requests")
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
        chunk = self.read()
        if chunk is not None:
            self.take(chunk)

    def take(self, chunk: bytes) -> None:
        """Hands out the answers in what was read."""
        done = self.decode(chunk)
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

    def fail_all(self, why: str | None, kind: str = "crash", kill: bool = False) -> None:
        """The process is gone (or made to go): every pending call fails at once."""
        if kill:
            self.host.kill()
        with self.mu:
            if self.dead is not None:
                return
            self.dead = "(ending)"
        detail = self.end_host(why, kill)
        with self.mu:
            self.dead = detail
            for rid, entry in self.pending.items():
                if isinstance(entry, dict):
                    entry[rid] = _failure(self.aids[rid], kind, detail)
                    continue
                if entry.result is None:
                    entry.result = _failure(entry.aid, kind, detail)
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
             state_json: str | None, deadline: float, user: str | None = None) -> ToolResult:
        reg = self.register(aid, deadline)
        if isinstance(reg, ToolResult):
            return reg
        rid, entry = reg
        line = _core.encode_request(rid, aid, input_json, key, token, ms, state_json, user)
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
            self.fail_all(None)  # the process is gone: say how
        elif status == ROUND_TRIP_WRITE_FAILED:
            self.fail_all("the host stopped reading requests")
        elif written < len(line):
            self.gave_up_writing(deadline)

    def call_batch(self, items: list[Prepared],
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
                        aid, input_json, key, token, ms, state_json, user = items[sent]
                        rid = next(self.ids)
                        self.pending[rid] = answers
                        self.aids[rid] = aid
                        rids.append(rid)
                        batch.append((rid, aid, input_json, key, token, ms, state_json, user))
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


class AsyncSession(Session):
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
            settle(fut, _failure(aid, "crash", self.dead), state, check)
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
            batch.give(batch.sent, _failure(batch.items[batch.sent][0], kind, why))
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
                    settle(what[3], _failure(what[1], "timeout", "no room in the host's request window before "
                                                                 "the deadline"), what[4], what[5])
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
        self._deliver(rid, _failure(aid, "timeout", f"no answer to a call to {aid} within {self.grace:g} s "
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
            self._deliver(rid, _failure(self.aids[rid], kind, self.dead))
        while self.queue:  # never sent
            q = self.queue.popleft()
            if isinstance(q, _Batch):
                self._fail_unsent(q, kind, self.dead)
            else:
                settle(q[3], _failure(q[1], kind, self.dead), q[4], q[5])
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
