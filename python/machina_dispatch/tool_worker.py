"""A Python tool worker speaking tool protocol v1 (docs/python-tools.md).

    python -m machina_dispatch.tool_worker [--root DIR]...           # one call, as tool protocol v1's runner
    python -m machina_dispatch.tool_worker --serve [--root DIR]...   # one call per line, warm

A call is the protocol's request object::

    {"protocol_version": 1, "tool": "greeter", "entry": "tools.sample_tool:greet",
     "payload": {"name": "Ada"}, "sandbox": true, "trace_id": "…", "capability_context": {…}}

and its answer ``{"ok": true, "protocol_version": 1, "result": …}`` or ``{"ok": false,
"protocol_version": 1, "error": {"type", "message", "reason_code"?}}``, plus an additive
``trace`` object: what the tool printed (``stdout``, ``stderr``, each at most
``CAPTURE_BYTES``, with ``output_truncated``), ``duration_ms``, ``protocol_version``,
``python_path``, ``python_env``, ``trace_id`` (the caller's, else a fresh one) and, once a
module was reloaded, ``module_reloaded``.

Without ``--serve`` the worker reads all of stdin as one request, writes one answer and exits:
status 0 when it wrote an answer, failed tool or not; 1 when stdin is not a request or the
result has no JSON form (an answer is still written) — tool protocol v1's one-shot runner's
behaviour, so that a tool written for it runs unchanged. With ``--serve`` it reads one request
per line (at most ``--max-line-bytes``) and answers each on one line, in order, until end of
input; an interpreter and its imports are then reused from call to call.

Entries are ``module:function`` (dotted attributes allowed after the colon), imported from
the ``--root`` directories first (the manifest's directory, as tool protocol v1 imports from
the app root). Modules are imported once; a module whose source file changed on disk (mtime or
size) is reloaded before its next call. ``--module NAME=SOURCE`` defines a module from source
text given on the command line before the first call (how the host hands its own built-in
Python code, such as execute_python's runner, to workers that may read no file of it).

The protocol stream is a private copy of the process's stdout: during a call ``sys.stdout`` and
``sys.stderr`` are captured, and anything written to descriptor 1 by other means (a C
extension, a child process) goes to stderr, so nothing a tool does reaches the stream.
"""

from __future__ import annotations

import argparse
import decimal
import importlib
import io
import json
import os
import sys
import time
import types
import uuid
from collections.abc import Callable
from typing import IO, Any

__all__ = ["CAPTURE_BYTES", "PROTOCOL_VERSION", "ToolWorker", "main"]

PROTOCOL_VERSION = 1
CAPTURE_BYTES = 64 * 1024  # of what a call prints, per stream
DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024


class _Capture(io.TextIOBase):
    """A text stream that keeps at most `limit` characters and says if it dropped any."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[str] = []
        self.size = 0
        self.truncated = False

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        room = self.limit - self.size
        if len(s) > room:
            self.truncated = True
            s = s[:max(room, 0)]
        if s:
            self.parts.append(s)
            self.size += len(s)
        return len(s)

    def text(self) -> str:
        return "".join(self.parts)


def _json_default(value: Any) -> Any:
    """What tool protocol v1 does with values json cannot write: Decimals become ints when whole,
    else their normalised string."""
    if isinstance(value, decimal.Decimal):
        if value == value.to_integral_value():
            return int(value)
        return str(value.normalize())
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


class _Failure(Exception):
    """A call refused before the tool ran (bad request)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class ToolWorker:
    """Runs calls of protocol v1 in this interpreter; keeps imported modules warm."""

    def __init__(self, roots: list[str] | None = None) -> None:
        for root in reversed(roots or []):
            path = os.path.abspath(root)
            if path not in sys.path:
                sys.path.insert(0, path)
        self._seen: dict[str, tuple[int, int]] = {}  # module name -> (mtime_ns, size) at import
        self._entries: dict[str, tuple[str, list[str]]] = {}  # entry -> (module name, attribute path)

    def _module(self, name: str) -> tuple[types.ModuleType, bool]:
        """The module, imported once; reloaded when its source changed. (module, reloaded)."""
        module = sys.modules.get(name)
        if module is None:
            module = importlib.import_module(name)
            self._seen[name] = _stamp(module)
            return module, False
        stamp = _stamp(module)
        seen = self._seen.get(name)
        if seen is not None and stamp != seen:
            importlib.invalidate_caches()
            module = importlib.reload(module)
            self._seen[name] = _stamp(module)
            return module, True
        if seen is None:
            self._seen[name] = stamp
        return module, False

    def _function(self, entry: Any) -> tuple[Callable[[Any], Any], bool]:
        parsed = self._entries.get(entry) if type(entry) is str else None
        if parsed is None:
            if not isinstance(entry, str) or entry.count(":") != 1:
                raise _Failure("ValueError", f"entry must be 'module:function', not {entry!r}")
            module_name, attr = entry.split(":")
            if not module_name or not attr:
                raise _Failure("ValueError", f"entry must be 'module:function', not {entry!r}")
            parsed = (module_name, attr.split("."))
            if len(self._entries) < 4096:
                self._entries[entry] = parsed
        module, reloaded = self._module(parsed[0])
        target: Any = module
        for part in parsed[1]:
            target = getattr(target, part)
        if not callable(target):
            raise _Failure("TypeError", f"{entry} is not callable")
        return target, reloaded

    def call(self, request: Any) -> tuple[dict[str, Any], bool]:
        """One call: (the answer object, whether its result had a JSON form)."""
        started = time.perf_counter()
        trace: dict[str, Any] = {"protocol_version": PROTOCOL_VERSION, "python_path": sys.executable,
                                 "python_env": sys.prefix}
        out, err = _Capture(CAPTURE_BYTES), _Capture(CAPTURE_BYTES)
        serialisable = True
        try:
            if type(request) is not dict:
                raise _Failure("ValueError", "the request must be a JSON object")
            trace_id = request.get("trace_id")
            trace["trace_id"] = trace_id if type(trace_id) is str and trace_id else str(uuid.uuid4())
            version = request.get("protocol_version", PROTOCOL_VERSION)
            if version != PROTOCOL_VERSION:
                raise _Failure("ValueError", f"protocol_version {version!r} is not supported (this worker speaks 1)")
            deadline = request.get("deadline_monotonic_ms")
            if type(deadline) is int and time.monotonic() * 1000 >= deadline:
                # Queued behind other calls past its deadline (machina-toolhost's own
                # addition to the protocol): the host has answered it already.
                raise _Failure("TimeoutError", "the call's deadline passed before it started; it did not run")
            saved = sys.stdout, sys.stderr
            sys.stdout, sys.stderr = out, err  # an import's prints too
            try:
                function, reloaded = self._function(request.get("entry"))
                if reloaded:
                    trace["module_reloaded"] = True
                result = function(request.get("payload", {}))
            finally:
                sys.stdout, sys.stderr = saved
            answer: dict[str, Any] = {"ok": True, "protocol_version": PROTOCOL_VERSION}
            try:
                # The result as it will be written (once, here): a value with no JSON form
                # fails the call, not the protocol stream.
                answer["result"] = _Encoded(_dumps(result))
            except (TypeError, ValueError) as e:
                serialisable = False
                answer = _error("TypeError", f"the tool's result has no JSON form: {e}")
        except _Failure as e:
            answer = _error(e.kind, str(e))
        except Exception as e:  # the tool's failure (or its import's), named by its class
            answer = _error(type(e).__name__, str(e), _reason_code(e))
        trace["stdout"] = "".join(out.parts)
        trace["stderr"] = "".join(err.parts)
        trace["output_truncated"] = out.truncated or err.truncated
        trace["duration_ms"] = round((time.perf_counter() - started) * 1000, 3)
        answer["trace"] = trace
        return answer, serialisable


def _reason_code(e: BaseException) -> Any:
    """Why a check refused the call, as the exception says it: its ``reason_code``, else the
    ``reason`` of the check it carries (``e.check.reason``, as capability errors do)."""
    code = getattr(e, "reason_code", None)
    if code is None:
        code = getattr(getattr(e, "check", None), "reason", None)
    return code


def _error(kind: str, message: str, reason_code: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"type": kind, "message": message}
    if isinstance(reason_code, str):
        error["reason_code"] = reason_code
    return {"ok": False, "protocol_version": PROTOCOL_VERSION, "error": error}


def _stamp(module: types.ModuleType) -> tuple[int, int]:
    path = getattr(module, "__file__", None)
    try:
        st = os.stat(path) if path else None
    except OSError:
        st = None
    return (st.st_mtime_ns, st.st_size) if st else (0, 0)


class _Encoded(str):
    """A result already encoded as JSON text, written into the answer as it is."""


_ENCODER = json.JSONEncoder(default=_json_default, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_ASCII_ENCODER = json.JSONEncoder(default=_json_default, ensure_ascii=True, allow_nan=False, separators=(",", ":"))


def _dumps(value: Any) -> str:
    # Strict JSON (no NaN or Infinity), compact; text that UTF-8 cannot carry (a lone
    # surrogate) is written escaped instead.
    text = _ENCODER.encode(value)
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            text = _ASCII_ENCODER.encode(value)
    return text


_orjson: Any = None
try:  # faster, where the interpreter has it; the standard library otherwise
    import orjson

    _orjson = orjson
except ImportError:  # pragma: no cover - depends on the interpreter
    pass


def _loads(data: bytes) -> Any:
    if _orjson is not None:
        try:
            return _orjson.loads(data)
        except _orjson.JSONDecodeError:
            pass  # (an integer past 64 bits, say: the standard library decides)
    return json.loads(data)


def _encode(answer: dict[str, Any]) -> bytes:
    result = answer.pop("result", None) if isinstance(answer.get("result"), _Encoded) else None
    data = None
    if _orjson is not None:
        try:
            data = _orjson.dumps(answer)
        except TypeError:
            pass  # (text UTF-8 cannot carry)
    if data is None:
        data = _dumps(answer).encode()
    if result is not None:  # spliced in as it was encoded: `result` comes last
        data = data[:-1] + b',"result":' + result.encode() + b"}"
    return data + b"\n"


def _write(sink: IO[bytes], data: bytes) -> None:
    """Writes all of `data` (a raw stream may take part of it)."""
    view = memoryview(data)
    while view:
        n = sink.write(view)
        view = view[n if n is not None else 0:]


def _protocol_stream() -> IO[bytes]:
    """A private copy of stdout for answers; descriptor 1 then points at stderr, so that
    output written around sys.stdout never lands in the protocol stream."""
    sys.stdout.flush()
    stream = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    return stream


def _define_module(spec: str) -> None:
    """`NAME=SOURCE`: the module NAME, made from SOURCE and put in sys.modules."""
    name, sep, source = spec.partition("=")
    if not sep or not name or not all(part.isidentifier() for part in name.split(".")):
        raise SystemExit(f"--module: expected NAME=SOURCE with NAME a module name, not {spec[:80]!r}")
    module = types.ModuleType(name)
    module.__file__ = f"<{name}>"
    sys.modules[name] = module
    exec(compile(source, module.__file__, "exec", dont_inherit=True), module.__dict__)


def _die_with_parent(parent: int) -> None:
    """SIGKILL when the parent ends (prctl PR_SET_PDEATHSIG); gone already if it has."""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the end of input still ends the worker
    if os.getppid() != parent:
        sys.exit(0)


def _serve(worker: ToolWorker, source: IO[bytes], sink: IO[bytes], max_line: int) -> int:
    while True:
        line = source.readline(max_line + 1)
        if not line:
            return 0
        if len(line) > max_line and not line.endswith(b"\n"):
            while True:  # the rest of the over-long line is dropped
                rest = source.readline(1 << 20)
                if not rest or rest.endswith(b"\n"):
                    break
            _write(sink, _encode(_error("ValueError", f"request line longer than {max_line} bytes")))
            continue
        if not line.strip():
            continue
        try:
            request = _loads(line)
        except ValueError as e:
            _write(sink, _encode(_error("ValueError", f"request is not JSON: {e}")))
            continue
        answer, _ = worker.call(request)
        _write(sink, _encode(answer))


def _once(worker: ToolWorker, source: IO[bytes], sink: IO[bytes], max_line: int) -> int:
    data = source.read(max_line + 1)
    if len(data) > max_line:
        _write(sink, _encode(_error("ValueError", f"request longer than {max_line} bytes")))
        return 1
    try:
        request = _loads(data)
    except ValueError as e:
        _write(sink, _encode(_error("ValueError", f"request is not JSON: {e}")))
        return 1
    answer, serialisable = worker.call(request)
    _write(sink, _encode(answer))
    return 0 if serialisable else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m machina_dispatch.tool_worker",
                                     description="Run Python tools over tool protocol v1.")
    parser.add_argument("--serve", action="store_true", help="answer one request per line until end of input")
    parser.add_argument("--root", action="append", default=[], help="a directory modules are imported from first")
    parser.add_argument("--max-line-bytes", type=int, default=DEFAULT_MAX_LINE_BYTES,
                        help="longest request accepted (default %(default)s)")
    parser.add_argument("--die-with-parent", type=int, metavar="PID",
                        help="end when the process PID (this one's parent) ends (Linux)")
    parser.add_argument("--module", action="append", default=[], metavar="NAME=SOURCE",
                        help="define the module NAME from the source text SOURCE before serving")
    args = parser.parse_args(argv)
    if args.max_line_bytes < 1:
        parser.error("--max-line-bytes must be at least 1")
    if args.die_with_parent is not None:
        _die_with_parent(args.die_with_parent)
    sink = _protocol_stream()
    for spec in args.module:  # (after: what it prints goes to stderr)
        _define_module(spec)
    worker = ToolWorker(args.root)
    run = _serve if args.serve else _once
    return run(worker, sys.stdin.buffer, sink, args.max_line_bytes)


if __name__ == "__main__":
    sys.exit(main())
