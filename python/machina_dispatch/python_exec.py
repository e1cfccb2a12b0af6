"""The code runner of execute_python (docs/tool-packs.md#execute_python), inside a tool worker.

The host starts tool workers (tool_worker.py ``--serve``) inside the sandbox launcher's walls
and hands them this module's source as ``--module machina_python_exec=SOURCE``; its calls
name the entries ``machina_python_exec:execute`` and ``machina_python_exec:list_packages``.
It uses the standard library only, so that any interpreter can run it.

``execute(payload)`` runs ``payload["code"]`` like a REPL cell: the statements in order, and
the value of the last one when it is an expression is the result. The payload also says:
``cwd`` (the folder the code runs in), ``own_folder_only`` (from this call on, the process
changes the file system beneath ``cwd`` only: for an interpreter that runs one call),
``session`` (keep the names the code defines for the next call of this worker; else a fresh
namespace), ``session_new``, ``max_output_bytes`` (of stdout and of stderr each),
``max_result_bytes``, ``cpu_seconds`` and ``memory_mb`` (for the advice). The answer is
always a result (the call itself succeeded)::

    {"threads": 0, "success": true, "result": ..., "result_truncated": false, "stdout": "...",
     "stderr": "...", "stdout_truncated": false, "stderr_truncated": false, "execution_ms": 1.2}
    {"threads": 0, "success": false, "error": "NameError: name 'x' is not defined",
     "error_type": "NameError", "traceback": "...", "advice": "..." or null, "line": 3 or null, ...}

A result with no JSON form is represented, never refused: ``{"repr": ..., "type": ...}`` in
its place (NaN and the infinities, bytes, sets, objects; a container past 100 levels or
100 000 values; an integer of more than 4 000 digits), and one over ``max_result_bytes`` by
a cut repr with ``"truncated": true``. ``threads`` counts the Python threads the code left
running, as the interpreter knows them (the host counts the process's threads itself, those
started around the interpreter too).

``list_packages(payload)`` lists the distributions the interpreter can import, the first of
each name on its path, with ``installed`` true for those in the workspace's own environment
(a virtual environment: ``sys.prefix``).
"""

from __future__ import annotations

import _thread
import ast
import builtins
import ctypes
import importlib
import importlib.util
import io
import json
import linecache
import math
import os
import platform
import re
import reprlib
import resource
import signal
import sys
import tempfile
import time
import traceback
import types
from typing import Any

__all__ = ["execute", "list_packages", "represent"]

MAX_DEPTH = 100
MAX_VALUES = 100_000
MAX_INT_BITS = 13_000  # about 4 000 decimal digits (str() of an int refuses past 4 300)
MAX_REPR_CHARS = 10_000
MAX_TRACEBACK_CHARS = 16_000
MAX_PACKAGES = 10_000
KEPT_SOURCES = 64  # sources of a session's earlier calls kept for its tracebacks

# Import names whose distribution has another name (for the advice on a missing module).
DISTRIBUTION_OF = {
    "attr": "attrs", "bs4": "beautifulsoup4", "cv2": "opencv-python", "Crypto": "pycryptodome",
    "dateutil": "python-dateutil", "docx": "python-docx", "dotenv": "python-dotenv", "fitz": "PyMuPDF",
    "jwt": "PyJWT", "magic": "python-magic", "PIL": "Pillow", "pptx": "python-pptx", "serial": "pyserial",
    "skimage": "scikit-image", "sklearn": "scikit-learn", "yaml": "PyYAML",
}

_NOTHING = object()


class _Output(io.TextIOBase):
    """A text stream that keeps at most `limit` bytes of UTF-8 and says whether it dropped any."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.parts: list[str] = []
        self.size = 0
        self.truncated = False
        self.buffer = _BinaryOutput(self)

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        n = len(s)
        if self.truncated or not s:
            return n
        data = s.encode("utf-8", "replace")
        room = self.limit - self.size
        if len(data) > room:
            self.truncated = True
            data = data[:room]
        if data:
            self.parts.append(data.decode("utf-8", "ignore"))
            self.size += len(data)
        return n

    def getvalue(self) -> str:
        return "".join(self.parts)


class _BinaryOutput(io.RawIOBase):
    """sys.stdout.buffer of an _Output: bytes written are decoded (invalid UTF-8 replaced)."""

    def __init__(self, text: _Output) -> None:
        super().__init__()
        self.text = text

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        data = bytes(b)
        self.text.write(data.decode("utf-8", "replace"))
        return len(data)


# --- results as JSON ------------------------------------------------------------------------


class _TooMuch(Exception):
    """A value past MAX_VALUES: represented whole."""


def _type_name(value: Any) -> str:
    t = type(value)
    module = getattr(t, "__module__", "")
    name = getattr(t, "__qualname__", t.__name__)
    return name if module in ("builtins", "__main__", "", None) else f"{module}.{name}"


class _Shortener(reprlib.Repr):
    """reprlib's abbreviations, but a __repr__ that fails says so (reprlib would show an
    address instead, which changes from run to run)."""

    def repr_instance(self, x: Any, level: int) -> str:
        text = builtins.repr(x)
        return text if len(text) <= self.maxother else text[:self.maxother - 3] + "..."


def _repr_of(value: Any, limit: int) -> str:
    shortener = _Shortener()
    shortener.maxlevel = 6
    shortener.maxstring = shortener.maxother = shortener.maxlong = limit
    for attribute in ("maxlist", "maxtuple", "maxset", "maxfrozenset", "maxdeque", "maxdict", "maxarray"):
        setattr(shortener, attribute, 1000)
    try:
        text = shortener.repr(value)
    except Exception as e:  # a __repr__ of the code's own that fails
        text = f"<{_type_name(value)} object: repr() failed: {type(e).__name__}: {e}>"
    return _clean(text[:limit])


def _represented(value: Any, limit: int = MAX_REPR_CHARS) -> dict[str, Any]:
    return {"repr": _repr_of(value, limit), "type": _type_name(value)}


_SURROGATE = re.compile("[\ud800-\udfff]")


def _clean(text: str) -> str:
    """Text UTF-8 can carry (a lone surrogate becomes U+FFFD)."""
    return text if text.isascii() else _SURROGATE.sub("\ufffd", text)


def _convert(value: Any, depth: int, path: set[int], budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise _TooMuch
    if value is None or value is True or value is False:
        return value
    if isinstance(value, str):
        return _clean(str(value))
    if isinstance(value, int):
        if value.bit_length() <= MAX_INT_BITS:
            return int(value)
        return {"repr": f"<an int of about {int(value.bit_length() * math.log10(2)) + 1} digits>",
                "type": _type_name(value)}
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else {"repr": repr(float(value)), "type": _type_name(value)}
    if isinstance(value, (list, tuple)):
        if depth >= MAX_DEPTH or id(value) in path:
            return _represented(value)
        path.add(id(value))
        try:
            return [_convert(item, depth + 1, path, budget) for item in value]
        finally:
            path.discard(id(value))
    if isinstance(value, dict) and all(type(k) is str for k in value):
        if depth >= MAX_DEPTH or id(value) in path:
            return _represented(value)
        path.add(id(value))
        try:
            return {_clean(k): _convert(v, depth + 1, path, budget) for k, v in value.items()}
        finally:
            path.discard(id(value))
    return _represented(value)


def represent(value: Any, max_bytes: int) -> tuple[Any, bool]:
    """The value as JSON carries it (what has no JSON form represented by its repr and type),
    and whether it had to be cut to stay within `max_bytes` of JSON."""
    try:
        out = _convert(value, 0, set(), [MAX_VALUES])
        text = json.dumps(out, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (_TooMuch, RecursionError, ValueError, TypeError):
        out = _represented(value)
        text = json.dumps(out, ensure_ascii=False, separators=(",", ":"))
    if len(text.encode("utf-8")) <= max_bytes:
        return out, False
    cut = _represented(value, max(16, max_bytes // 2))
    cut["truncated"] = True
    return cut, True


# --- errors and their advice ------------------------------------------------------------------


def _user_traceback(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback from the code's first frame on (the runner's frames left out)."""
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<code"):
        tb = tb.tb_next
    return tb


def _format_traceback(error: BaseException) -> str:
    if isinstance(error, SyntaxError):
        lines = traceback.format_exception_only(type(error), error)
    else:
        shown = traceback.TracebackException(type(error), error, _user_traceback(error.__traceback__))
        # The runner's own frames (the CPU limit's signal handler) are not the code's.
        shown.stack = traceback.StackSummary.from_list([f for f in shown.stack if f.filename != _SELF])
        lines = list(shown.format())
    text = "".join(lines)
    if len(text) > MAX_TRACEBACK_CHARS:
        text = "...\n" + text[-MAX_TRACEBACK_CHARS:]
    return _clean(text)


def _error_line(error: BaseException) -> int | None:
    if isinstance(error, SyntaxError):
        return error.lineno
    line = None
    tb = _user_traceback(error.__traceback__)
    while tb is not None:  # the innermost frame of the code's own
        if tb.tb_frame.f_code.co_filename.startswith("<code"):
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _message(error: BaseException) -> str:
    name = type(error).__name__
    if isinstance(error, SyntaxError):
        where = f" (line {error.lineno})" if error.lineno else ""
        return f"{name}: {error.msg}{where}"
    try:
        text = str(error)
    except Exception:
        text = ""
    return _clean(f"{name}: {text}" if text else name)[:MAX_REPR_CHARS]


def _advice(error: BaseException, payload: dict[str, Any]) -> str | None:
    session = bool(payload.get("session"))
    if isinstance(error, SyntaxError):
        where = f"line {error.lineno}" + (f", column {error.offset}" if error.offset else "")
        text = (error.text or "").strip()
        shown = f": {text!r}" if text else ""
        return (f"The code did not run: Python cannot parse it at {where}{shown} ({error.msg}). Fix that line "
                "(a missing ':', bracket or quote, or wrong indentation) and run it again.")
    if isinstance(error, ModuleNotFoundError) and error.name:
        top = error.name.split(".")[0]
        if top != error.name and importlib.util.find_spec(top) is not None:
            return (f"The package '{top}' is installed but has no module '{error.name}': check the name "
                    "(list_python_packages shows what is installed).")
        package = DISTRIBUTION_OF.get(top, top)
        return (f"The module '{top}' is not installed in this workspace. Install it with install_python_package "
                f"(package: '{package}'), or run the code again with install_packages: ['{package}'].")
    if isinstance(error, TimeoutError) and getattr(error, "cpu_limit", False):
        return (f"The code used its CPU time limit of {payload.get('cpu_seconds')} s and was stopped. Make it do less "
                "work in one call (smaller inputs, a faster algorithm), or split the work over several calls"
                + (" of this session (its variables are kept)." if session else " in a session."))
    if isinstance(error, MemoryError):
        return (f"The code ran out of memory (the limit is {payload.get('memory_mb')} MB). Work on smaller pieces "
                "(read files in chunks, use generators), free large objects with del, or keep less in memory at once.")
    if isinstance(error, RecursionError):
        return ("The code recursed deeper than Python allows (sys.getrecursionlimit()). Look for a recursion "
                "without an end, or make it a loop.")
    if isinstance(error, SystemExit):
        return "exit() and sys.exit() stop the code where they are called; leave them out to get a result."
    if isinstance(error, PermissionError):
        return ("The sandbox refused it: code here has no network (no socket at all), cannot start processes, "
                "writes only in its own folder (the working directory) and reads only that folder, the "
                "interpreter's files and the installed packages.")
    if isinstance(error, NameError) and session and payload.get("session_new"):
        return ("This session has just started: names defined by earlier calls are gone (a session ends when it is "
                "idle too long, when its code runs past its time, or to make room). Define them again.")
    return None


# --- running code ---------------------------------------------------------------------------


_SELF = __file__
_session_globals: dict[str, Any] | None = None
_calls = 0
_cpu_running = False
_cpu_seconds = 0


def _on_cpu_limit(signum: int, frame: Any) -> None:
    if _cpu_running:
        error = TimeoutError(f"the CPU time limit of this call was reached ({_cpu_seconds} s)")
        error.cpu_limit = True  # type: ignore[attr-defined]
        raise error


def _limit_cpu(seconds: int) -> None:
    """The per-call CPU limit: a soft RLIMIT_CPU this many seconds past what the worker has used."""
    if seconds <= 0:
        return
    used = resource.getrusage(resource.RUSAGE_SELF)
    spent = int(used.ru_utime + used.ru_stime)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = spent + seconds
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _unlimit_cpu() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))


def _remember_source(filename: str, code: str) -> None:
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    if filename.startswith("<code #"):
        old = f"<code #{_calls - KEPT_SOURCES}>"
        linecache.cache.pop(old, None)


def _leave(folder: str) -> None:
    """Out of a call's own folder (the host removes it): its import finder forgotten (the
    import system keeps one per working directory searched, which would grow call by call),
    the working directory its parent."""
    sys.path_importer_cache.pop(folder, None)
    try:
        os.chdir(os.path.dirname(folder))
    except OSError:
        pass


# Landlock (linux/landlock.h): the rights that change the file system, by ABI version.
_LANDLOCK_WRITES = {1: 0x1FF2, 2: 0x3FF2, 3: 0x7FF2}  # (REFER from 2, TRUNCATE from 3)


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _write_only_beneath(folder: str) -> None:
    """From now on this process changes the file system beneath `folder` only: a Landlock
    layer on top of the walls it was started in (whose writable root holds the folders of
    other calls running at the same time). It lasts as long as the process, which runs this
    one call. Raises OSError when the kernel refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    create, add_rule, restrict = 444, 445, 446  # (the same numbers on every architecture)
    abi = syscall(create, None, ctypes.c_size_t(0), ctypes.c_uint32(1))  # LANDLOCK_CREATE_RULESET_VERSION
    if abi < 1:
        raise OSError(ctypes.get_errno(), "Landlock is not available")
    rights = _LANDLOCK_WRITES[min(int(abi), 3)]
    handled = ctypes.c_uint64(rights)
    ruleset = syscall(create, ctypes.byref(handled), ctypes.c_size_t(8), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "cannot make a Landlock ruleset")
    try:
        parent = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        null = os.open(os.devnull, os.O_PATH | os.O_CLOEXEC)
        try:
            # /dev/null stays writable (WRITE_FILE and, from ABI 3, TRUNCATE: a file's rights).
            for fd, allowed in ((parent, rights), (null, rights & 0x4002)):
                rule = _PathBeneath(allowed, fd)
                if syscall(add_rule, ctypes.c_int(ruleset), ctypes.c_int(1), ctypes.byref(rule),
                           ctypes.c_uint32(0)) != 0:
                    raise OSError(ctypes.get_errno(), f"cannot add a Landlock rule for {folder}")
        finally:
            os.close(parent)
            os.close(null)
        libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS (set by the walls already)
        if syscall(restrict, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "cannot enforce a Landlock ruleset")
    finally:
        os.close(ruleset)


def _namespace(session: bool) -> dict[str, Any]:
    global _session_globals
    fresh = {"__name__": "__main__", "__builtins__": builtins, "__doc__": None}
    if not session:
        return fresh
    if _session_globals is None:
        _session_globals = fresh
    return _session_globals


def _run(code: str, filename: str, namespace: dict[str, Any]) -> Any:
    tree = ast.parse(code, filename, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body[-1].value)
        del tree.body[-1]
    exec(compile(tree, filename, "exec", dont_inherit=True), namespace)
    if last is None:
        return _NOTHING
    return eval(compile(last, filename, "eval", dont_inherit=True), namespace)


def execute(payload: dict[str, Any]) -> dict[str, Any]:
    """Runs one call's code; its result or its failure, with what it printed."""
    global _calls, _cpu_running, _cpu_seconds
    code = payload["code"]
    session = bool(payload.get("session"))
    limit = int(payload.get("max_output_bytes", 65536))
    out, err = _Output(limit), _Output(limit)
    _calls += 1
    filename = f"<code #{_calls}>" if session else "<code>"
    _remember_source(filename, code)
    os.chdir(payload["cwd"])
    if payload.get("own_folder_only"):
        _write_only_beneath(payload["cwd"])
    # Temporary files and the home folder are the call's own folder too.
    os.environ["HOME"] = os.environ["TMPDIR"] = tempfile.tempdir = payload["cwd"]
    importlib.invalidate_caches()  # packages installed since the last call
    namespace = _namespace(session)
    sys.argv = [""]
    saved = sys.stdout, sys.stderr, sys.stdin
    value: Any = _NOTHING
    failure: BaseException | None = None
    previous = signal.signal(signal.SIGXCPU, _on_cpu_limit)
    started = time.perf_counter()
    try:
        sys.stdout, sys.stderr, sys.stdin = out, err, io.StringIO("")
        _cpu_running = True
        _cpu_seconds = int(payload.get("cpu_seconds", 0))
        _limit_cpu(_cpu_seconds)
        value = _run(code, filename, namespace)
    except BaseException as e:  # whatever the code raised is its result
        failure = e
    finally:
        _cpu_running = False
        elapsed = time.perf_counter() - started
        sys.stdout, sys.stderr, sys.stdin = saved
        _unlimit_cpu()
        signal.signal(signal.SIGXCPU, previous)
        if not session:
            _leave(payload["cwd"])
    answer: dict[str, Any] = {"threads": _thread._count()}
    if failure is None:
        result, cut = represent(None if value is _NOTHING else value, int(payload.get("max_result_bytes", 65536)))
        answer.update(success=True, result=result, result_truncated=cut)
    else:
        answer.update(success=False, error=_message(failure), error_type=type(failure).__name__,
                      traceback=_format_traceback(failure), advice=_advice(failure, payload),
                      line=_error_line(failure))
    answer.update(stdout=out.getvalue(), stderr=err.getvalue(), stdout_truncated=out.truncated,
                  stderr_truncated=err.truncated, execution_ms=round(elapsed * 1000, 3))
    return answer


# --- packages ---------------------------------------------------------------------------------


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _beneath(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def list_packages(payload: dict[str, Any]) -> dict[str, Any]:
    """The distributions this interpreter can import: name, version, and whether the
    workspace's environment holds it (installed there) or the interpreter does."""
    from importlib import metadata

    own = os.path.realpath(sys.prefix) if sys.prefix != sys.base_prefix else None
    found: dict[str, dict[str, Any]] = {}
    truncated = False
    if payload.get("cwd"):
        os.chdir(payload["cwd"])
    for dist in metadata.distributions(path=[p for p in sys.path if p]):
        name = dist.metadata["Name"] if dist.metadata is not None else None
        if not name:
            continue
        key = _canonical(name)
        if key in found:
            continue  # the first on the path is the one imported
        if len(found) >= MAX_PACKAGES:
            truncated = True
            break
        where = os.path.realpath(str(dist.locate_file("")))
        found[key] = {"name": _clean(name), "version": _clean(dist.version or ""),
                      "installed": own is not None and _beneath(where, own)}
    packages = sorted(found.values(), key=lambda p: (_canonical(p["name"]), p["name"]))
    return {"python": platform.python_version(), "packages": packages, "truncated": truncated}
