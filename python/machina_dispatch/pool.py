"""The serve-pool transport: persistent ``machina-toolhost --serve`` processes, pipelined.

The pool chooses a process for each call and keeps the set of processes: sync calls share
up to ``processes`` of them (:class:`~machina_dispatch._pool_host_threaded.ThreadedPoolHost`),
each asyncio event loop gets as many of its own
(:class:`~machina_dispatch._pool_host_asyncio.AsyncioPoolHost`); each is started on first
use and replaced when it dies. How one process is driven, bounded and failed is in
``_pool_host*.py``; how it is started, drained and ended, in ``_process.py``.
:meth:`Pool.close` (also run at interpreter exit, and on SIGTERM when the default handler
was in place) ends every process; none is ever left behind.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import signal
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

from ._arguments import check_list_argument
from ._locate import check_setup, find_executable_for_plugins, not_found_message
from ._pool_host import Prepared
from ._pool_host_asyncio import AsyncioPoolHost, settle
from ._pool_host_threaded import ThreadedPoolHost
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

__all__ = ["Pool"]

DEFAULT_SPIN_US = 50  # longer than a sleep and a cross-CPU wake-up take, so a quick answer is caught spinning
MAX_SPIN_US = 10_000  # the host's --spin-us range


class Pool(Transport):
    """A pool of ``machina-toolhost --serve`` processes.

    Args:
        processes: how many host processes (sync calls use up to this many; asyncio calls
            as many again, per event loop). Started on first use, restarted when they die.
        workers: ``--workers`` of each process (calls run concurrently inside it).
        executable: the ``machina-toolhost`` to run (found as usual otherwise).
        plugins: plugin libraries to load instead of the built-in pack.
        tools: TOML tool manifests whose tools to load too (``--tools``).
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
                 plugins: Sequence[str | os.PathLike[str]] | None = None,
                 tools: Sequence[str | os.PathLike[str]] | None = None, args: list[str] | None = None,
                 timeout: float | None = None, max_in_flight: int = 1024, grace: float = 1.0,
                 close_timeout: float = 2.0, env: dict[str, str] | None = None,
                 spin_us: int = DEFAULT_SPIN_US) -> None:
        super().__init__(timeout)
        check_list_argument("plugins", plugins)
        check_list_argument("tools", tools)
        check_list_argument("args", args)
        if processes < 1 or workers < 1 or max_in_flight < 1:
            raise ValueError("processes, workers and max_in_flight must be at least 1")
        if not isinstance(spin_us, int) or not 0 <= spin_us <= MAX_SPIN_US:
            raise ValueError(f"spin_us must be a whole number from 0 to {MAX_SPIN_US}")
        exe = find_executable_for_plugins(executable, plugins)
        if exe is None:
            from ._errors import ExecutableNotFound

            raise ExecutableNotFound(ToolResult.failure("", "not_found", not_found_message(executable)))
        options = ["--workers", str(workers), "--spin-us", str(spin_us),
                   *[a for p in plugins or [] for a in ("--plugin", os.fspath(p))],
                   *[a for t in tools or [] for a in ("--tools", os.fspath(t))], *(args or [])]
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
        self._sync: list[ThreadedPoolHost | None] = [None] * processes
        self._solo: AsyncioPoolHost | None = None  # the last loop's process, with processes=1
        self._team: tuple[asyncio.AbstractEventLoop, list[AsyncioPoolHost]] | None = None  # the same, with more
        self._async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[AsyncioPoolHost | None]] = (
            weakref.WeakKeyDictionary())
        self._closed = False
        _LIVE.add(self)
        _install_sigterm_cleanup()

    # --- choosing a process --------------------------------------------------------------

    def _sync_process(self) -> ThreadedPoolHost:
        """An idle live process, else a new one in a free slot, else the least loaded."""
        first = self._sync[0]
        if first is not None and first.dead is None and not first.pending and not self._closed:
            return first  # the common case, without the lock
        with self._lock:
            if self._closed:
                raise RuntimeError("the pool is closed")
            best: ThreadedPoolHost | None = None
            free = -1
            for i, p in enumerate(self._sync):
                if p is None or p.dead is not None:
                    free = i if free < 0 else free
                elif best is None or p.load() < best.load():
                    best = p
            if best is None or (best.load() > 0 and free >= 0):
                best = self._sync[free] = self._new_sync_process()
            return best

    def _new_sync_process(self) -> ThreadedPoolHost:
        return ThreadedPoolHost(self.argv, self.env, self.max_in_flight, self.grace, self.spin_us)

    def _async_processes(self, n: int) -> list[AsyncioPoolHost]:
        """The `n` least loaded live processes of this loop (started where needed)."""
        self._async_process()  # replaces dead ones
        loop = asyncio.get_running_loop()
        with self._lock:
            procs = [p for p in self._async.get(loop, []) if p is not None]
        return sorted(procs, key=AsyncioPoolHost.load)[:n]

    def _async_process(self) -> AsyncioPoolHost:
        """This loop's least loaded process (dead ones replaced)."""
        loop = asyncio.get_running_loop()
        solo = self._solo  # one process: no choice to make, no lock to take
        if solo is not None and solo.loop is loop and solo.dead is None and not self._closed:
            return solo
        team = self._team  # the last loop's processes, all alive when last looked: no lock
        if team is not None and team[0] is loop and not self._closed:
            chosen, least = team[1][0], -1
            for member in team[1]:
                if member.dead is not None:
                    break
                load = len(member.pending) + len(member.queue)
                if least < 0 or load < least:
                    chosen, least = member, load
            else:
                return chosen
        with self._lock:
            if self._closed:
                raise RuntimeError("the pool is closed")
            procs = self._async.setdefault(loop, [None] * self.processes)
            best: AsyncioPoolHost | None = None
            for i, p in enumerate(procs):
                if p is None or p.dead is not None:
                    p = procs[i] = AsyncioPoolHost(self.argv, self.env, self.max_in_flight, self.grace, loop)
                if best is None or p.load() < best.load():
                    best = p
            assert best is not None
            if self.processes == 1:
                self._solo = best
            else:
                self._team = (loop, [p for p in procs if p is not None])
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
            list[Prepared], list[float], list[tuple[int, State]],
            dict[int, ToolResult]]:
        """A batch's requests and their deadlines, the calls that carry a state, and the
        calls refused before sending (both by their index in the batch)."""
        prepared: list[Prepared] = []
        deadlines: list[float] = []
        states: list[tuple[int, State]] = []
        refused: dict[int, ToolResult] = {}
        now = time.monotonic()  # one clock read for the batch
        for i, c in enumerate(calls):
            aid, inputs, key, token, timeout, state, user = call_fields(c)
            ready = self._prepare(aid, inputs, state, timeout, now)
            if isinstance(ready, ToolResult):
                refused[i] = ready
                continue
            if state is not None:
                states.append((i, state))
            input_json, ms, state_json, d = ready
            prepared.append((aid, input_json, key, token, ms, state_json, user))
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
             timeout: float | None = None, check: bool = True, user: str | None = None) -> ToolResult:
        """See :meth:`Transport.call`.

        Raises:
            ToolhostError: with ``check``, the subclass for the failure's kind.
        """
        ready = self._prepare(aid, inputs, state, timeout)
        if isinstance(ready, ToolResult):
            return refuse(ready, check)
        input_json, ms, state_json, deadline = ready
        r = self._sync_process().call(aid, input_json, idempotency_key, lease_token, ms, state_json, deadline, user)
        apply_state(state, r)
        if check and not r.ok:
            r.raise_for_error()
        return r

    def acall(self, aid: str, inputs: Any = None, *, state: State | None = None,
              idempotency_key: str | None = None, lease_token: str | None = None,
              timeout: float | None = None, check: bool = True, user: str | None = None) -> asyncio.Future[ToolResult]:
        """See :meth:`Transport.acall`; read by the running event loop, no threads. Returns
        a future (await it, or hand it to ``asyncio.gather``): a call costs no task.

        Raises:
            ToolhostError: (from the await) with ``check``, the subclass for the failure's kind.
        """
        try:
            ready = self._prepare(aid, inputs, state, timeout)
            if isinstance(ready, ToolResult):
                fut: asyncio.Future[ToolResult] = asyncio.get_running_loop().create_future()
                settle(fut, ready, None, check)
                return fut
            input_json, ms, state_json, deadline = ready
            proc = self._async_process()
        except Exception as e:  # raised where it is awaited, as from a coroutine
            fut = asyncio.get_running_loop().create_future()
            fut.set_exception(e)
            return fut
        return proc.start(aid, input_json, idempotency_key, lease_token, ms, state_json, deadline, state, check, user)

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
            self._solo = self._team = None  # no loop kept alive by a closed pool
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
            procs: list[ThreadedPoolHost | AsyncioPoolHost | None] = [*self._sync]
            for ps in self._async.values():
                procs.extend(ps)
        return [p.host.pid for p in procs if p is not None and p.dead is None]

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
