"""machina-toolhost as a NATS micro service (``machina-toolhost-nats``; docs/nats.md).

A front only: each message becomes one request to the in-process host
(:meth:`_core.Host.call_json`, the same path as ``--serve``), and its answer goes back in
the form the request came in. Subjects (``PREFIX`` is ``machina`` by default):

- ``PREFIX.call`` — our request envelope (``{"aid": ..., "input_json": ...}``, as
  ``--serve`` reads it) or an OpenAI tool call; answers our response (or the tool message).
- ``PREFIX.tool.<aid>`` — one endpoint per tool; also the seed's subjects
  (``tools.file.read``, ...) for the tools registered under those names. A body is our
  envelope if it has ``aid`` or ``input_json``, an OpenAI call if it has a ``function``
  object, and otherwise the tool's own input (the seed's raw fields), answered
  ``{"data": ..., "error": null}`` / ``{"data": null, "error": "Type: message"}``.
- ``$SRV.PING|INFO|STATS[.machina-toolhost[.<id>]]`` — discovery and per-endpoint stats
  (ADR-32, the shapes of ``nats.micro``).

Every endpoint is in the queue group ``q``: N host processes share the load. Calls run on
a thread pool (the host releases the GIL), at most ``--concurrency`` at once; beyond that
the subscription's pending queue (``--max-pending`` messages) holds them, and the server
drops what exceeds it (the requester's timeout then says so) — never an unbounded buffer.

With ``--idempotency kv`` (implied by ``--durable``) calls that carry an idempotency key
claim it in a JetStream key-value bucket shared by every host of the group before running,
so a retry that lands on another host — after the first one died — never runs the tool a
second time: it gets the stored answer, or, if the claiming host died before answering,
an error saying that the outcome is unknown. Every entry is signed with a key the hosts
share and their clients do not have (``--kv-key-file``); an entry that fails its check is
neither replayed nor run over (see :class:`StoreSeal`). A stored answer reaches its caller
through the host (:meth:`_core.Host.replay_json`): the same request rules and lease gate
as a call, and an audit record.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import orjson

from . import _core
from ._nats_wire import (
    DEFAULT_PREFIX,
    DEFAULT_URL,
    DURABLE_CONSUMER,
    DURABLE_STREAM,
    HDR_ERROR,
    HDR_ERROR_CODE,
    HDR_IDEMPOTENCY_KEY,
    HDR_LEASE,
    HDR_MSG_ID,
    HDR_REPLY_TO,
    HDR_REQUEST_ID,
    HDR_TIMEOUT_MS,
    HDR_USER,
    HDR_WIRE_CODE,
    IDEMPOTENCY_BUCKET,
    QUEUE_GROUP,
    SERVICE_NAME,
    call_subject,
    durable_subject,
    tool_subject,
    tools_subject,
)

__all__ = ["FrontOptions", "NatsFront", "main"]

VERSION = _core.__version__
WAIT_POLL_S = 0.02  # how often a duplicate looks whether the first call has finished
TAKEOVER_MARGIN_S = 0.1  # past a call's deadline, when the front answers `timeout` itself
FETCH_BATCH = 64
CONNECT_TIMEOUT_S = 5.0
DRAIN_TIMEOUT_S = 5.0  # durable mode: messages asked for at once (at most the free slots)
KV_KEY_MIN_BYTES = 32  # the shortest key the shared store is signed with (--kv-key-file)
# The host's answer when a request is refused before a tool could run: no claim is kept.
_NOT_RUN_CODES = frozenset({"breaker_open", "overloaded", "lease_required", "lease_rejected", "guarantee_blocked",
                            "idempotency_conflict", "rate_limited", "tool_not_found"})
# `audit_unavailable` is answered both before a tool runs (the store could not write) and after
# it ran (its record could not be written, the answer withheld); only the first leaves no run.
_AUDIT_REFUSED_BEFORE_RUN = "is not run until it can"
# The error type a failure on the `tools.*` subjects is worded with, by our wire code: a
# column of the core's error-kind table (a pack tool's message already starts with its type).
_ERROR_TYPES = {code: error_type for code, _status, _breaker, error_type in _core.error_kinds()}
_TYPE_PREFIXES = tuple(sorted({f"{t}:" for t in _ERROR_TYPES.values()}))


def service_error_code(response: Mapping[str, Any]) -> str:
    """The numeric ``Nats-Service-Error-Code`` of a failed response (HTTP's meanings)."""
    code = response.get("code") or ""
    if response.get("status") == "INVALID_PICK":
        return "404" if code == "tool_not_found" else "400"
    if response.get("status") == "BREAKER_TRIP" or code in ("service_unavailable", "audit_unavailable"):
        return "503"
    return {"timeout": "504", "access_denied": "403", "lease_required": "401", "lease_rejected": "403",
            "guarantee_blocked": "403", "target_not_found": "404", "rate_limited": "429", "overloaded": "429",
            "idempotency_conflict": "409"}.get(code, "500")


def seed_error(response: Mapping[str, Any]) -> str:
    """A failure as seed 002 words it: ``"Type: message"``."""
    text = str(response.get("error") or "failed")
    if text.startswith(_TYPE_PREFIXES):
        return text
    return f"{_ERROR_TYPES.get(str(response.get('code') or ''), 'SystemError')}: {text}"


def host_response(status: str, code: str, error: str) -> dict[str, Any]:
    """A failure the front answers itself, in the host's response shape."""
    return {"ok": False, "status": status, "error": error, "code": code}


def load_kv_key(path: str) -> bytes:
    """The shared store's key from its file (trailing CR and LF removed). Raises
    OSError if it cannot be read, ValueError if it is shorter than KV_KEY_MIN_BYTES."""
    with open(path, "rb") as f:
        key = f.read().rstrip(b"\r\n")
    if len(key) < KV_KEY_MIN_BYTES:
        raise ValueError(f"the key must be at least {KV_KEY_MIN_BYTES} bytes long")
    return key


class StoreSeal:
    """Signs and checks the entries of the group's shared store (HMAC-SHA256).

    Whoever may write into the bucket can put any value under any key, and a store key is a
    plain hash of an idempotency key: an entry counts only if a host holding the group's key
    wrote it under that very store key, so that neither an answer, nor a claim, nor an entry
    moved from another key is taken from anyone else. The fingerprint of a call's input is
    keyed too, so the store shows nothing of inputs to those who can read it. The signing
    key is derived from the file's key for this purpose alone: a file that also holds
    another secret (the lease key) signs nothing here that it signs there."""

    _PURPOSE = b"machina-toolhost shared idempotency store v1"

    def __init__(self, key: bytes) -> None:
        if len(key) < KV_KEY_MIN_BYTES:
            raise ValueError(f"the shared store's key must be at least {KV_KEY_MIN_BYTES} bytes long")
        self._key = hmac.new(key, self._PURPOSE, hashlib.sha256).digest()

    def fingerprint(self, aid: str, input_json: str) -> str:
        """What binds a key to one call: the tool and its exact input text."""
        return hmac.new(self._key, b"fp\0" + aid.encode() + b"\0" + input_json.encode(), hashlib.sha256).hexdigest()

    def seal(self, kv_key: str, entry: Mapping[str, Any]) -> bytes:
        """`entry` as the value stored under `kv_key`: its signature, a space, its JSON."""
        body = orjson.dumps(entry)
        return self._mac(kv_key, body) + b" " + body

    def open(self, kv_key: str, value: bytes) -> dict[str, Any] | None:
        """The entry a host of the group stored under `kv_key`, or None if `value` is not one."""
        mac, sep, body = value.partition(b" ")
        if not sep or not hmac.compare_digest(mac, self._mac(kv_key, body)):
            return None
        try:
            entry = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        return entry if isinstance(entry, dict) and entry.get("state") in ("running", "done") else None

    def _mac(self, kv_key: str, body: bytes) -> bytes:
        return hmac.new(self._key, b"entry\0" + kv_key.encode() + b"\0" + body, hashlib.sha256).hexdigest().encode()


class ForgedEntry(Exception):
    """The shared store holds an entry under a key that no host of the group wrote."""


@dataclass
class FrontOptions:
    """How the front serves (the tool options belong to the host)."""

    prefix: str = DEFAULT_PREFIX
    queue_group: str = QUEUE_GROUP
    concurrency: int = 32  # calls running at once
    max_pending: int = 4096  # messages waiting per subscription (the server drops beyond)
    max_pending_bytes: int = 64 * 1024 * 1024
    idempotency: str = "local"  # "local": each host's own cache; "kv": shared by the group
    kv_bucket: str = IDEMPOTENCY_BUCKET
    kv_key: bytes = b""  # the key the group's hosts sign the shared store's entries with (--kv-key-file)
    kv_ttl_s: float = 600.0  # how long a stored answer is replayed (the bucket's max age)
    max_timeout_ms: int = 600_000  # the host's ceiling on deadlines (--max-timeout-ms)
    stuck_threads: int = 16  # threads beyond `concurrency` for inline calls left running past their deadline
    claim_grace_ms: int = 5_000  # a claim outlives its call's deadline by this much before it is judged dead
    durable: bool = False  # also take calls from the JetStream work queue
    stream: str = DURABLE_STREAM
    consumer: str = DURABLE_CONSUMER
    ack_wait_s: float = 30.0
    max_deliver: int = 5
    stream_max_msgs: int = 100_000
    stream_max_bytes: int = 256 * 1024 * 1024


@dataclass
class Endpoint:
    """One subscribed subject and its ADR-32 statistics."""

    name: str
    subject: str
    queue_group: str
    aid: str  # "" for the envelope endpoint (the request names the tool)
    metadata: dict[str, str] = field(default_factory=dict)
    num_requests: int = 0
    num_errors: int = 0
    processing_time: int = 0  # nanoseconds, all requests
    last_error: str = ""
    entries_rejected: int | None = None  # shared store entries that failed their check (None: no shared store)

    def record(self, elapsed_ns: int, error: str | None) -> None:
        self.num_requests += 1
        self.processing_time += elapsed_ns
        if error is not None:
            self.num_errors += 1
            self.last_error = error[:512]

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "subject": self.subject, "queue_group": self.queue_group,
                "metadata": self.metadata}

    def stats(self) -> dict[str, Any]:
        average = self.processing_time // self.num_requests if self.num_requests else 0
        return {"name": self.name, "subject": self.subject, "queue_group": self.queue_group,
                "num_requests": self.num_requests, "num_errors": self.num_errors, "last_error": self.last_error,
                "processing_time": self.processing_time, "average_processing_time": average,
                "data": None if self.entries_rejected is None
                else {"idempotency_entries_rejected": self.entries_rejected}}


@dataclass
class Call:
    """One message, understood: what to send the host and how to answer."""

    form: str  # "envelope", "openai" or "seed"
    request: bytes  # our envelope, as the host reads it
    aid: str  # the tool ("" when the envelope names it and the endpoint does not)
    check_aid: str  # for call_json: the endpoint's aid, checked against the envelope's
    idempotency_key: str | None
    input_json: str
    timeout_ms: int | None
    request_id: Any = None  # the envelope's "id"
    tool_call_id: str = ""  # OpenAI form
    function_name: str = ""


class BadRequest(Exception):
    """A message the front cannot turn into a request (``call``: what is known of it, so
    that the answer still comes in the request's form)."""

    def __init__(self, message: str, call: Call | None = None) -> None:
        super().__init__(message)
        self.call = call


def _endpoint_name(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in text)[:200] or "tool"


class NatsFront:
    """Serves a host's tools on a NATS connection (see the module docstring)."""

    def __init__(self, host: _core.Host, options: FrontOptions | None = None) -> None:
        self.host = host
        self.options = options or FrontOptions()
        tools = host.list_tools()
        self._tools: dict[str, dict[str, Any]] = {t["aid"]: t for t in tools}
        self._canonical = {t["aid"]: t.get("alias_of") or t["aid"] for t in tools}
        self._endpoints: list[Endpoint] = []
        self._subscriptions: list[Any] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._pool = ThreadPoolExecutor(max_workers=self.options.concurrency + self.options.stuck_threads,
                                        thread_name_prefix="nats-call")
        self._slots = asyncio.Semaphore(self.options.concurrency)
        self._nc: Any = None
        self._kv: Any = None
        self._seal: StoreSeal | None = None
        self._durable_task: asyncio.Task[None] | None = None
        self._stopping = False
        self.id = ""
        self.started = ""
        self.fault = os.environ.get("MACHINA_TOOLHOST_NATS_FAULT", "")  # fault injection (docs/development.md)

    # ---- start and stop

    async def start(self, nc: Any) -> None:
        """Subscribes every endpoint and the discovery subjects on ``nc`` (connected)."""
        self._nc = nc
        self.id = nc._nuid.next().decode()
        self.started = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # RFC 3339, as ADR-32 has it
        o = self.options
        self._add_endpoint(Endpoint("call", call_subject(o.prefix), o.queue_group, ""))
        self._add_endpoint(Endpoint("tools", tools_subject(o.prefix), o.queue_group, "", {"lists": "tools"}))
        for aid, tool in self._tools.items():
            subject = None if tool.get("alias_of") else tool_subject(o.prefix, aid)
            if subject is not None:
                self._add_endpoint(Endpoint(_endpoint_name(aid), subject, o.queue_group, aid, {"aid": aid}))
            if aid.startswith("tools.") and tool_subject("x", aid) is not None:  # a seed-002 subject
                self._add_endpoint(Endpoint(_endpoint_name(aid), aid, o.queue_group, aid, {"aid": aid}))
        if o.idempotency == "kv" or o.durable:
            if not o.kv_key:
                raise ValueError("the shared idempotency store needs the key its hosts sign entries with "
                                 "(FrontOptions.kv_key, --kv-key-file)")
            self._seal = StoreSeal(o.kv_key)
            await self._open_kv()
            for ep in self._endpoints:
                ep.entries_rejected = 0
        for ep in self._endpoints:
            self._subscriptions.append(await nc.subscribe(
                ep.subject, queue=ep.queue_group, cb=self._on_message(ep),
                pending_msgs_limit=o.max_pending, pending_bytes_limit=o.max_pending_bytes))
        for verb, handler in (("PING", self._ping), ("INFO", self._info), ("STATS", self._stats)):
            for subject in (f"$SRV.{verb}", f"$SRV.{verb}.{SERVICE_NAME}", f"$SRV.{verb}.{SERVICE_NAME}.{self.id}"):
                self._subscriptions.append(await nc.subscribe(subject, cb=handler))
        if o.durable:
            await self._start_durable()
        await nc.flush()

    async def stop(self) -> None:
        """Stops taking calls, answers every call already taken, then returns."""
        self._stopping = True
        for sub in self._subscriptions:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._subscriptions.clear()
        if self._durable_task is not None:
            self._durable_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._durable_task
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        # A thread still inside a tool past its deadline (its call answered long ago) is not
        # waited for: it may never return.
        self._pool.shutdown(wait=self.stuck_calls() == 0)

    def stuck_calls(self) -> int:
        """Threads still inside tools past their calls' deadlines (their calls answered)."""
        return int(self.host.stats()["stuck_now"])

    def _add_endpoint(self, ep: Endpoint) -> None:
        if all(e.subject != ep.subject for e in self._endpoints):
            self._endpoints.append(ep)

    async def _open_kv(self) -> None:
        from nats.js.api import KeyValueConfig

        js = self._nc.jetstream()
        try:
            self._kv = await js.key_value(self.options.kv_bucket)
        except Exception:  # not there yet: the first host of the group makes it
            self._kv = await js.create_key_value(KeyValueConfig(
                bucket=self.options.kv_bucket, ttl=self.options.kv_ttl_s, history=1,
                max_bytes=256 * 1024 * 1024, description="machina-toolhost idempotency claims and answers"))

    # ---- discovery (ADR-32)

    def _identity(self, kind: str) -> dict[str, Any]:
        return {"type": f"io.nats.micro.v1.{kind}_response", "name": SERVICE_NAME, "id": self.id,
                "version": VERSION, "metadata": {"prefix": self.options.prefix}}

    async def _ping(self, msg: Any) -> None:
        if self.may_answer(msg.reply):
            await msg.respond(orjson.dumps(self._identity("ping")))

    async def _info(self, msg: Any) -> None:
        body = self._identity("info")
        body["description"] = "machina-toolhost: every registered tool, one endpoint each (docs/nats.md)"
        body["endpoints"] = [ep.info() for ep in self._endpoints]
        if self.may_answer(msg.reply):
            await msg.respond(orjson.dumps(body))

    async def _stats(self, msg: Any) -> None:
        body = self._identity("stats")
        body["started"] = self.started
        body["endpoints"] = [ep.stats() for ep in self._endpoints]
        if self.may_answer(msg.reply):
            await msg.respond(orjson.dumps(body))

    @staticmethod
    def may_answer(subject: str) -> bool:
        """Whether an answer may go to `subject`, which the requester chose: never to one
        under ``$`` (JetStream's API, the key-value store, the system's subjects), where the
        host's own permissions would let the requester write through it."""
        if not subject.startswith("$"):
            return True
        print(f"machina-toolhost-nats: not answered: the reply subject {subject[:100]!r} lies under '$'",
              file=sys.stderr, flush=True)
        return False

    # ---- calls

    def _on_message(self, ep: Endpoint) -> Callable[[Any], Any]:
        async def on_message(msg: Any) -> None:
            # The subscription delivers one message at a time: take a slot (backpressure),
            # then let the call run on its own so a slow tool delays nothing else.
            await self._slots.acquire()
            task = asyncio.get_running_loop().create_task(self._serve(ep, msg))
            self._tasks.add(task)
            task.add_done_callback(self._finished)
        return on_message

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()

    async def _serve(self, ep: Endpoint, msg: Any) -> None:
        if msg.reply and not self.may_answer(msg.reply):
            return  # (not run: its answer could go nowhere)
        start = time.perf_counter_ns()
        headers: dict[str, str] = {}
        body, error = await self.answer(ep, msg.data, msg.headers or {}, headers)
        ep.record(time.perf_counter_ns() - start, error)
        if msg.reply:
            with contextlib.suppress(Exception):  # the requester may be gone; nothing to tell
                await self._nc.publish(msg.reply, body, headers=headers or None)

    async def answer(self, ep: Endpoint, data: bytes, in_headers: Mapping[str, str],
                     out_headers: dict[str, str]) -> tuple[bytes, str | None]:
        """One message's answer body, and its error text (None when the call succeeded).
        Never raises: a request always gets one answer."""
        form = "seed" if ep.aid.startswith("tools.") else "envelope"
        if ep.name == "tools" and not ep.aid:  # the tool list, as --list prints it
            return orjson.dumps(self.host.list_tools()), None
        call: Call | None = None
        try:
            call = self.parse(ep, data, in_headers)
            form = call.form
            response = await self.run(call, ep)
        except BadRequest as e:
            response = host_response("INVALID_PICK", "malformed_request", f"malformed request: {e}")
            call = e.call
            if call is not None:
                form = call.form
        except Exception as e:  # a bug here must still answer the request
            response = host_response("TOOL_ERROR", "internal_error", f"NATS front: {type(e).__name__}: {e}")
            call = None
        ok = bool(response.get("ok"))
        if not ok:
            text = str(response.get("error") or "failed")[:1024]
            out_headers[HDR_ERROR] = text.replace("\r", " ").replace("\n", " ")
            out_headers[HDR_ERROR_CODE] = service_error_code(response)
            out_headers[HDR_WIRE_CODE] = str(response.get("code") or "")
        error = None if ok else str(response.get("error") or "failed")
        return self.render(form, call, response), error

    def parse(self, ep: Endpoint, data: bytes, headers: Mapping[str, str]) -> Call:
        """A message as a request to the host (:class:`BadRequest` if it cannot be one)."""
        try:
            body = orjson.loads(data) if data.strip() else {}
        except orjson.JSONDecodeError as e:
            raise BadRequest(f"the body is not JSON: {e}") from None
        options: dict[str, Any] = {}
        if headers.get(HDR_USER):
            options["user"] = headers[HDR_USER]
        if headers.get(HDR_LEASE):
            options["_lease_token"] = headers[HDR_LEASE]
        if headers.get(HDR_TIMEOUT_MS):
            try:
                options["timeout_ms"] = int(headers[HDR_TIMEOUT_MS])
            except ValueError:
                raise BadRequest(f"{HDR_TIMEOUT_MS} is not an integer") from None
        key = headers.get(HDR_IDEMPOTENCY_KEY) or None
        if key is not None:
            options["idempotency_key"] = key
        if isinstance(body, dict) and isinstance(body.get("function"), dict):
            return self._openai_call(ep, body, options)
        if not ep.aid or (isinstance(body, dict) and ("aid" in body or "input_json" in body)):
            if not isinstance(body, dict):
                raise BadRequest("a request must be a JSON object")
            input_json = body.get("input_json", "{}")
            aid = str(body.get("aid") or ep.aid)
            k = body.get("idempotency_key")
            t = body.get("timeout_ms")
            return Call("envelope", data, aid, ep.aid, k if isinstance(k, str) else None,
                        input_json if isinstance(input_json, str) else "", t if isinstance(t, int) else None,
                        request_id=body.get("id"))
        # The tool's own input: the seed's raw fields.
        text = data.decode() if data.strip() else "{}"
        request = orjson.dumps({"aid": ep.aid, "input_json": text, **options})
        return Call("seed", request, ep.aid, "", key, text, options.get("timeout_ms"))

    def _openai_call(self, ep: Endpoint, body: dict[str, Any], options: dict[str, Any]) -> Call:
        fn = body["function"]
        name = fn.get("name")
        call_id = body.get("tool_call_id", body.get("id", ""))
        known = Call("openai", b"", "", "", None, "", None, tool_call_id=str(call_id),
                     function_name=name if isinstance(name, str) else "")
        if not isinstance(name, str) or not name:
            raise BadRequest("function.name must be a non-empty string", known)
        aid = self.resolve(name)
        if aid is None:
            aid = name  # the host answers tool_not_found
        elif ep.aid and self._canonical.get(aid) != self._canonical.get(ep.aid):
            raise BadRequest(f"function {name!r} is not the tool of subject {ep.subject!r}", known)
        arguments = fn.get("arguments", "{}")
        if isinstance(arguments, dict):
            arguments = orjson.dumps(arguments).decode()
        if not isinstance(arguments, str):
            raise BadRequest("function.arguments must be a JSON string", known)
        arguments = arguments or "{}"
        request = orjson.dumps({"aid": aid, "input_json": arguments, **options})
        return Call("openai", request, aid, "", options.get("idempotency_key"), arguments, options.get("timeout_ms"),
                    tool_call_id=str(call_id), function_name=name)

    def resolve(self, name: str) -> str | None:
        """The registered tool a model's function name means: an aid or alias as it is, or
        the name the LLM formats give an aid (dots and other characters escaped)."""
        if name in self._tools:
            return name
        try:
            from .llm import ToolCatalog  # noqa: PLC0415 - optional companion module
        except ImportError:  # pragma: no cover - the module ships with the package
            return None
        catalog = getattr(self, "_catalog", None)
        if catalog is None:
            catalog = self._catalog = ToolCatalog(list(self._tools.values()))
        try:
            aid = catalog.aid_for(name)
        except (KeyError, ValueError):
            return None
        return aid if aid in self._tools else None

    def render(self, form: str, call: Call | None, response: dict[str, Any]) -> bytes:
        """The answer in the request's own form."""
        if form == "seed":
            if response.get("ok"):
                out = response.get("output_json") or "null"
                return b'{"data":' + out.encode() + b',"error":null}'
            return orjson.dumps({"data": None, "error": seed_error(response)})
        if form == "openai" and call is not None:
            if response.get("ok"):
                value = orjson.loads(response.get("output_json") or "null")
                content = value if isinstance(value, str) else (response.get("output_json") or "null")
            else:
                content = f"Error: {response.get('error') or 'failed'}"
            return orjson.dumps({"tool_call_id": call.tool_call_id, "role": "tool", "name": call.function_name,
                                 "content": content})
        return orjson.dumps(response)

    async def run(self, call: Call, ep: Endpoint) -> dict[str, Any]:
        """The host's response to one call; with the shared store, at most one run per key."""
        if self._kv is None or call.idempotency_key is None:
            return await self._run_on_host(call)
        return await self._run_once(call, ep)

    async def _run_on_host(self, call: Call) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        running = loop.run_in_executor(self._pool, self.host.call_json, call.request, _core.Session(), call.check_aid,
                                       "nats")
        deadline_ms = self._deadline_ms(call)
        try:
            text = await asyncio.wait_for(asyncio.shield(running), deadline_ms / 1000 + TAKEOVER_MARGIN_S)
        except asyncio.TimeoutError:
            # Inline, the host answers a call past its deadline only once the tool gives its
            # thread back: the front answers on time instead, and the thread finishes alone
            # (process isolation kills the tool at the deadline; the host counts stuck calls).
            late = host_response("TOOL_ERROR", "timeout",
                                 f"timeout: {call.aid or 'the call'} did not finish within {deadline_ms} ms")
            late["ds_state"] = {"delta": True, "slots": {}, "removed_slots": []}  # as the host answers it
            return late
        response: dict[str, Any] = orjson.loads(text)
        return response

    # ---- one run per idempotency key across the group (JetStream key-value)

    def _deadline_ms(self, call: Call) -> int:
        """The call's deadline as the host sets it (the request's, else the tool's)."""
        if call.timeout_ms is not None and call.timeout_ms > 0:
            return min(call.timeout_ms, self.options.max_timeout_ms)
        tool = self._tools.get(call.aid)
        return min(int(tool.get("timeout_ms") or 30_000) if tool else 30_000, self.options.max_timeout_ms)

    async def _run_once(self, call: Call, ep: Endpoint) -> dict[str, Any]:
        from nats.js.errors import KeyWrongLastSequenceError

        assert call.idempotency_key is not None and self._seal is not None
        kv_key = "k" + hashlib.sha256(call.idempotency_key.encode()).hexdigest()
        fingerprint = self._seal.fingerprint(self._canonical.get(call.aid, call.aid), call.input_json)
        deadline_ms = self._deadline_ms(call)
        try:
            for _ in range(50):
                now_ms = int(time.time() * 1000)
                claim = {"state": "running", "fp": fingerprint, "host": self.id,
                         "until_ms": now_ms + deadline_ms + self.options.claim_grace_ms}
                try:
                    await self._kv.create(kv_key, self._seal.seal(kv_key, claim))
                except KeyWrongLastSequenceError:
                    pass  # someone holds the key: look at what they left
                else:
                    response = await self._run_on_host(call)
                    if self.fault == "exit-after-run":
                        os._exit(70)
                    if response.get("status") == "INVALID_PICK" or response.get("code") in _NOT_RUN_CODES or (
                            response.get("code") == "audit_unavailable"
                            and _AUDIT_REFUSED_BEFORE_RUN in str(response.get("error", ""))):
                        await self._kv.delete(kv_key)  # the tool did not run: a retry may run it
                    else:
                        stored = {k: v for k, v in response.items() if k != "id"}
                        done = {"state": "done", "fp": fingerprint, "response": stored}
                        await self._kv.put(kv_key, self._seal.seal(kv_key, done))
                    return response
                held = await self._read(kv_key)
                if held is not None and held.get("state") != "done":
                    held = await self._wait_done(kv_key, int(held.get("until_ms", 0)))
                    if held is None:
                        return await self._replay(call, host_response(
                            "TOOL_ERROR", "tool_crashed",
                            f"the host that took idempotency key {call.idempotency_key!r} stopped before answering; "
                            "whether the tool ran is unknown, and it is not run again under this key"))
                if not held:
                    continue  # deleted in between (the holder's call did not run): claim it anew
                if held.get("fp") != fingerprint:
                    return await self._replay(call, host_response(
                        "TOOL_ERROR", "idempotency_conflict",
                        "idempotency conflict: the key was used with different input"))
                return await self._replay(call, {**held["response"], "idempotent_hit": True})
        except ForgedEntry:
            return await self._replay(call, self._forged(ep, kv_key))
        return await self._replay(call, host_response("TOOL_ERROR", "internal_error",
                                                      "idempotency key kept changing hands"))

    async def _read(self, kv_key: str) -> dict[str, Any] | None:
        """The entry under `kv_key` (None: there is none). Raises ForgedEntry if it fails its check."""
        from nats.js.errors import KeyNotFoundError

        assert self._seal is not None
        try:
            entry = await self._kv.get(kv_key)
        except KeyNotFoundError:
            return None
        held = self._seal.open(kv_key, entry.value or b"")
        if held is None:
            raise ForgedEntry(kv_key)
        return held

    async def _wait_done(self, kv_key: str, until_ms: int) -> dict[str, Any] | None:
        """The entry once it is done (or gone: {}), or None once its claim has expired."""
        while int(time.time() * 1000) < until_ms:
            await asyncio.sleep(WAIT_POLL_S)
            held = await self._read(kv_key)
            if held is None:
                return {}
            if held.get("state") == "done":
                return held
        return None

    @staticmethod
    def _forged(ep: Endpoint, kv_key: str) -> dict[str, Any]:
        """The answer to a call whose key holds an entry no host of the group wrote (counted and
        logged). Neither replayed nor run: the entry may have replaced a real answer, so whether
        the tool ran under this key is unknown."""
        ep.entries_rejected = (ep.entries_rejected or 0) + 1
        print(f"machina-toolhost-nats: the shared idempotency store's entry {kv_key} fails its authentication "
              "check (no host of this group wrote it): not replayed, and its call not run", file=sys.stderr,
              flush=True)
        return host_response("TOOL_ERROR", "internal_error",
                             "internal error: the shared idempotency store's entry for this idempotency_key fails its "
                             "authentication check (no host of the group wrote it); it is not replayed, and the call "
                             "is not run, since whether the tool ran under this key is unknown")

    async def _replay(self, call: Call, stored: dict[str, Any]) -> dict[str, Any]:
        """`stored` as the answer to `call`, given by the host behind the rules and lease gate a
        call passes, and audited as a call is (the tool does not run)."""
        loop = asyncio.get_running_loop()
        text = await loop.run_in_executor(self._pool, self.host.replay_json, call.request, orjson.dumps(stored),
                                          _core.Session(), call.check_aid, "nats")
        response: dict[str, Any] = orjson.loads(text)
        return response

    # ---- durable mode (JetStream work queue)

    async def _start_durable(self) -> None:
        from nats.js.api import ConsumerConfig, RetentionPolicy, StreamConfig

        o = self.options
        js = self._nc.jetstream()
        config = StreamConfig(name=o.stream, subjects=[durable_subject(o.prefix)], retention=RetentionPolicy.WORK_QUEUE,
                              max_msgs=o.stream_max_msgs, max_bytes=o.stream_max_bytes, duplicate_window=120.0)
        try:
            await js.add_stream(config)
        except Exception:
            await js.update_stream(config)
        sub = await js.pull_subscribe(durable_subject(o.prefix), durable=o.consumer, stream=o.stream,
                                      config=ConsumerConfig(ack_wait=o.ack_wait_s, max_deliver=o.max_deliver,
                                                            max_ack_pending=o.concurrency * 4))
        self._durable_endpoint = Endpoint("durable", durable_subject(o.prefix), o.consumer, "",
                                          entries_rejected=0)
        self._endpoints.append(self._durable_endpoint)
        self._durable_task = asyncio.get_running_loop().create_task(self._pull(sub))

    async def _pull(self, sub: Any) -> None:
        from nats.errors import TimeoutError as NatsTimeout

        while not self._stopping:
            await self._slots.acquire()  # a free slot for each message fetched
            free = 1
            while free < FETCH_BATCH and not self._slots.locked():
                await self._slots.acquire()
                free += 1
            try:
                msgs = await sub.fetch(batch=free, timeout=1.0)
            except (NatsTimeout, asyncio.TimeoutError):
                msgs = []
            except Exception:  # the server restarting, the consumer being re-made: try again shortly
                msgs = []
                await asyncio.sleep(0.2)
            for _ in range(free - len(msgs)):
                self._slots.release()
            for msg in msgs:
                task = asyncio.get_running_loop().create_task(self._serve_durable(msg))
                self._tasks.add(task)
                task.add_done_callback(self._finished)

    async def _serve_durable(self, msg: Any) -> None:
        headers = msg.headers or {}
        reply_to = headers.get(HDR_REPLY_TO, "")
        msg_id = headers.get(HDR_MSG_ID, "")
        ep = self._durable_endpoint
        if reply_to and not self.may_answer(reply_to):
            with contextlib.suppress(Exception):
                await msg.ack()  # (not run, and not delivered again: its answer could go nowhere)
            return
        start = time.perf_counter_ns()
        keepalive = asyncio.get_running_loop().create_task(self._keep_in_progress(msg))
        try:
            in_headers = dict(headers)
            if msg_id and not in_headers.get(HDR_IDEMPOTENCY_KEY):
                in_headers[HDR_IDEMPOTENCY_KEY] = "msg:" + msg_id  # a redelivery never runs twice
            out_headers: dict[str, str] = {HDR_REQUEST_ID: msg_id}
            body, error = await self.answer_durable(msg.data, in_headers, out_headers)
        finally:
            keepalive.cancel()
        ep.record(time.perf_counter_ns() - start, error)
        if self.fault == "exit-before-ack":
            os._exit(71)
        if reply_to:
            with contextlib.suppress(Exception):
                await self._nc.publish(reply_to, body, headers=out_headers)
        with contextlib.suppress(Exception):
            await msg.ack()

    async def answer_durable(self, data: bytes, headers: Mapping[str, str],
                             out_headers: dict[str, str]) -> tuple[bytes, str | None]:
        """A durable message's answer: as on ``PREFIX.call``, with the envelope's own key or
        else the message id as the idempotency key."""
        ep = self._durable_endpoint
        try:
            body = orjson.loads(data)
        except orjson.JSONDecodeError:
            body = None
        if isinstance(body, dict) and not isinstance(body.get("function"), dict) and not body.get("idempotency_key") \
                and headers.get(HDR_IDEMPOTENCY_KEY):
            body["idempotency_key"] = headers[HDR_IDEMPOTENCY_KEY]
            data = orjson.dumps(body)
        return await self.answer(ep, data, headers, out_headers)

    async def _keep_in_progress(self, msg: Any) -> None:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            while True:
                await asyncio.sleep(max(0.05, self.options.ack_wait_s / 3))
                await msg.in_progress()


# ---- the console script

def _host_option_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("host options (as machina-toolhost takes them)")
    for name in _core.host_options():
        if name in ("isolation", "worker_executable", "tool_timeouts_ms"):
            continue
        flag = "--" + name.replace("_", "-")
        if name == "no_network":
            group.add_argument(flag, action="store_true", default=None, help="tools get no network (process isolation)")
        elif name == "worker_env":
            group.add_argument(flag, action="append", metavar="NAME", help="pass this variable to tools (repeatable)")
        elif name in ("audit_db", "audit_jsonl"):
            group.add_argument(flag, metavar="FILE", help=f"the audit store's {name[6:]} file (docs/tool-packs.md)")
        elif name == "audit_required":
            group.add_argument(flag, choices=("leased", "all", "none"),
                               help="calls refused while the audit store cannot record (docs/operations.md)")
        else:
            group.add_argument(flag, type=int, metavar="N", help=f"the host's {name}")
    group.add_argument("--tool-timeout", action="append", metavar="AID=MS", default=[],
                       help="deadline for one tool (repeatable)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="machina-toolhost-nats",
        description="Serve every registered tool as a NATS micro service (queue group, $SRV discovery, "
                    "durable JetStream mode). See docs/nats.md.")
    p.add_argument("--url", default=os.environ.get("NATS_URL", DEFAULT_URL),
                   help="the NATS server (default: $NATS_URL, else %(default)s)")
    p.add_argument("--prefix", default=DEFAULT_PREFIX, help="subject prefix (default: %(default)s)")
    p.add_argument("--queue-group", default=QUEUE_GROUP, help="queue group shared by the hosts (default: %(default)s)")
    p.add_argument("--concurrency", type=int, default=32, help="calls running at once (default: %(default)s)")
    p.add_argument("--max-pending", type=int, default=4096,
                   help="messages waiting per subject before the server drops them (default: %(default)s)")
    p.add_argument("--idempotency", choices=("local", "kv"), default=None,
                   help="local: each host's own cache; kv: one store for the whole group in JetStream "
                        "(default: kv with --durable, else local)")
    p.add_argument("--kv-key-file", metavar="PATH",
                   help="kv: the key the group's hosts sign the store's entries with, shared by the hosts and "
                        f"never given to clients (at least {KV_KEY_MIN_BYTES} bytes; required with kv)")
    p.add_argument("--kv-bucket", default=IDEMPOTENCY_BUCKET, help="the shared store's bucket (default: %(default)s)")
    p.add_argument("--kv-ttl-s", type=float, default=600.0, help="how long a stored answer is replayed (seconds)")
    p.add_argument("--claim-grace-ms", type=int, default=5000,
                   help="kv: how long past a call's deadline its claim stands before a duplicate is told the "
                        "outcome is unknown (default: %(default)s)")
    p.add_argument("--durable", action="store_true", help="also take calls from the JetStream work queue "
                                                          f"({DURABLE_STREAM}; at-least-once delivery)")
    p.add_argument("--stream", default=DURABLE_STREAM, help="the durable mode's stream (default: %(default)s)")
    p.add_argument("--ack-wait-s", type=float, default=30.0,
                   help="durable mode: redeliver a call whose host went silent this long (default: %(default)s)")
    p.add_argument("--max-deliver", type=int, default=5,
                   help="durable mode: deliveries of one call at most (default: %(default)s)")
    tools = p.add_argument_group("tools (as machina-toolhost takes them)")
    tools.add_argument("--plugin", action="append", metavar="PATH", help="load this plugin library (repeatable)")
    tools.add_argument("--tools", action="append", metavar="FILE", help="load this TOML tool manifest (repeatable)")
    tools.add_argument("--packs", metavar="LIST", help="built-in tool packs, comma-separated, or none")
    tools.add_argument("--policy", metavar="FILE", help="the tool packs' policy (TOML)")
    tools.add_argument("--isolation", choices=("inline", "process"), default="inline", help="where tools run")
    _host_option_flags(p)
    return p


def host_from_args(args: argparse.Namespace) -> Any:
    """The in-process host the arguments describe (an InProcess transport)."""
    from .inprocess import InProcess

    options: dict[str, Any] = {}
    for name in _core.host_options():
        value = getattr(args, name, None)
        if value is not None and name not in ("isolation", "worker_executable", "tool_timeouts_ms"):
            options[name] = value
    if args.tool_timeout:
        timeouts: dict[str, int] = {}
        for item in args.tool_timeout:
            aid, sep, ms = item.rpartition("=")
            if not sep or not aid or not ms.isdigit():
                raise SystemExit(f"machina-toolhost-nats: --tool-timeout wants AID=MS, not {item!r}")
            timeouts[aid] = int(ms)
        options["tool_timeouts_ms"] = timeouts
    packs = None  # all of them when no plugin is named
    if args.packs is not None:
        packs = [] if args.packs == "none" else [p for p in args.packs.split(",") if p]
    return InProcess(args.plugin, tools=args.tools, isolation=args.isolation, packs=packs, policy=args.policy,
                     **options)


async def serve(args: argparse.Namespace) -> int:
    try:
        import nats
    except ImportError:
        print("machina-toolhost-nats: nats-py is not installed (pip install 'machina-toolhost[nats]')",
              file=sys.stderr)
        return 2
    transport = host_from_args(args)
    options = FrontOptions(prefix=args.prefix, queue_group=args.queue_group, concurrency=args.concurrency,
                           max_pending=args.max_pending,
                           idempotency=args.idempotency or ("kv" if args.durable else "local"),
                           kv_bucket=args.kv_bucket, kv_key=args.kv_key, kv_ttl_s=args.kv_ttl_s,
                           max_timeout_ms=args.max_timeout_ms or 600_000,
                           claim_grace_ms=args.claim_grace_ms, durable=args.durable,
                           stream=args.stream, ack_wait_s=args.ack_wait_s, max_deliver=args.max_deliver)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def on_error(e: Exception) -> None:
        print(f"machina-toolhost-nats: {type(e).__name__}: {e}", file=sys.stderr)

    try:
        # Reconnects for ever once connected; the first connection is given CONNECT_TIMEOUT_S.
        nc = await asyncio.wait_for(nats.connect(args.url, name=f"{SERVICE_NAME}-{os.getpid()}", error_cb=on_error,
                                                 max_reconnect_attempts=-1, connect_timeout=2,
                                                 reconnect_time_wait=0.5), CONNECT_TIMEOUT_S)
    except (Exception, asyncio.TimeoutError) as e:
        print(f"machina-toolhost-nats: cannot connect to {args.url}: {e}", file=sys.stderr)
        transport.close()
        return 1
    front = NatsFront(transport.host, options)
    stuck = 0
    try:
        await front.start(nc)
        print(f"machina-toolhost-nats: serving {len(front._endpoints)} endpoints as {SERVICE_NAME} {front.id} "
              f"on {args.url}", file=sys.stderr, flush=True)
        await stop.wait()
        await front.stop()
        try:
            await asyncio.wait_for(nc.drain(), DRAIN_TIMEOUT_S)
        except Exception:
            await nc.close()
        stuck = front.stuck_calls()
    finally:
        transport.close()
    if stuck > 0:
        # Every call is answered and the host closed; the interpreter would wait at exit for
        # the threads still inside tools, which may be for ever. (As --serve does.)
        print(f"machina-toolhost-nats: exiting with {stuck} call(s) still stuck in tools past their deadline",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(0)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.concurrency < 1 or args.max_pending < 1 or args.max_deliver < 1 or args.ack_wait_s <= 0:
        parser().error("--concurrency, --max-pending, --max-deliver and --ack-wait-s must be positive")
    args.kv_key = b""
    if args.idempotency == "kv" or args.durable:
        if not args.kv_key_file:
            parser().error("the shared idempotency store (--idempotency kv, and --durable) needs --kv-key-file: "
                           "a key the group's hosts share and their clients never get, which signs the store's "
                           "entries (docs/nats.md)")
        try:
            args.kv_key = load_kv_key(args.kv_key_file)
        except (OSError, ValueError) as e:
            parser().error(f"--kv-key-file {args.kv_key_file}: {e.strerror if isinstance(e, OSError) else e}")
    try:
        return asyncio.run(serve(args))
    except Exception as e:  # a host set-up error (bad plugin, manifest, policy)
        print(f"machina-toolhost-nats: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
