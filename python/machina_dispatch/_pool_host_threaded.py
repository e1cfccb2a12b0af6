"""A pooled host process read by its sync callers' threads.

Whichever waiting thread holds the read lock reads for everyone, and hands the lock on
when its own answer has come, so a lone caller pays no thread switch; a lone caller's write
and read are one compiled step (``_core.round_trip``, the GIL released). What is shared
with the asyncio driver (the process, request ids, response matching, how a host ends) is
in :mod:`machina_dispatch._pool_host`.
"""

from __future__ import annotations

import functools
import os
import select
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from . import _core
from ._pool_host import PoolHost, Prepared
from ._result import ToolResult

__all__ = ["ThreadedPoolHost"]

ROUND_TRIP_EOF, ROUND_TRIP_WRITE_FAILED = 1, 3  # _core.round_trip's status (0 done, 2 out of time)


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


class ThreadedPoolHost(PoolHost):
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
                    why = "no room in the host's request window before the deadline"
                    return ToolResult.failure(aid, "timeout", why)
                self.room_waiters += 1
                try:
                    self.room.wait(left)
                finally:
                    self.room_waiters -= 1
            if self.dead is not None:
                return ToolResult.failure(aid, "crash", self.dead)
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
                entry.result = ToolResult.failure(entry.aid, "timeout", f"{why}; the host process was killed")
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
                    entry[rid] = ToolResult.failure(self.aids[rid], kind, detail)
                    continue
                if entry.result is None:
                    entry.result = ToolResult.failure(entry.aid, kind, detail)
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
        return [r if r is not None else ToolResult.failure(items[i][0], "crash", self.dead or "not sent")
                for i, r in enumerate(got)]

    def load(self) -> int:
        return len(self.pending)
