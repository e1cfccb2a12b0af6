"""Tools written for tool protocol v1 as its users write them."""

import decimal
import os
import sys
import time

IMPORTED_AT = time.time()
CALLS = {"n": 0}


class Blocked(Exception):
    reason_code = "guarantee_blocked"


def greet(payload):
    if "name" not in payload:
        raise ValueError("Missing input")
    print("greeting", payload["name"])
    return {"message": "Hello " + payload["name"], "ok": True}


def blocked(payload):
    raise Blocked("no network for this tool")


def noisy(payload):
    print("to stdout")
    print("to stderr", file=sys.stderr)
    os.write(1, b"straight to descriptor 1\n")
    return payload


def money(payload):
    return {"whole": decimal.Decimal("3.00"), "part": decimal.Decimal("2.50")}


def opaque(payload):
    return {1, 2}


def whoami(payload):
    """Which worker ran the call, how many calls it has run, and when its module was imported."""
    CALLS["n"] += 1
    return {"pid": os.getpid(), "calls": CALLS["n"], "imported_at": IMPORTED_AT, "python": sys.executable,
            "prefix": sys.prefix}


def sleep(payload):
    if "started" in payload:  # a file saying the call has begun
        with open(payload["started"], "w") as f:
            f.write("started\n")
    started_ns = time.monotonic_ns()
    time.sleep(payload.get("s", 0.1))
    if "mark" in payload:  # proof that it ran (a file the test looks for)
        with open(payload["mark"], "a") as f:
            f.write("ran\n")
    if payload.get("stamps"):  # when it started and ended (CLOCK_MONOTONIC nanoseconds)
        return {"slept": payload.get("s", 0.1), "pid": os.getpid(), "started_ns": started_ns,
                "ended_ns": time.monotonic_ns()}
    return {"slept": payload.get("s", 0.1), "pid": os.getpid()}


def crash(payload):
    os.write(2, b"about to exit 3\n")
    os._exit(3)


def segfault(payload):
    import ctypes

    os.write(2, b"about to crash\n")
    ctypes.string_at(0)


def hang(payload):
    """Starts a child that would outlive it, then never returns."""
    import subprocess

    child = subprocess.Popen(["sleep", "300"])
    with open(payload["pidfile"], "w") as f:
        f.write(str(child.pid))
    time.sleep(300)


def leak(payload):
    """Keeps what it allocates, call after call."""
    CALLS.setdefault("kept", []).append(bytearray(payload["mb"] * 1024 * 1024))
    return {"kept_mb": sum(len(b) for b in CALLS["kept"]) // (1024 * 1024)}


def big(payload):
    return "x" * payload["n"]


def counter(payload):
    """Counts its runs in a file (the idempotency tests)."""
    with open(payload["file"], "a") as f:
        f.write("1")
    with open(payload["file"]) as f:
        return {"runs": len(f.read())}


def env(payload):
    return {k: os.environ[k] for k in sorted(os.environ)}
