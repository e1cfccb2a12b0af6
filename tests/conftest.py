"""Shared fixtures: the installed machina-toolhost, the test plugins (built out of tree
against the installed ABI headers) and helpers that speak --run and --serve."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import machina_dispatch
import pytest

REPO = Path(__file__).resolve().parent.parent
TEST_PLUGIN_SRC = REPO / "tests" / "plugins"
TRANSCRIPTS = REPO / "tests" / "transcripts"

LEASE_SECRET = "test-secret-0123456789abcdef"


def find_toolhost() -> str:
    scripts = Path(sysconfig.get_path("scripts")) / "machina-toolhost"
    if scripts.exists():
        return str(scripts)
    found = shutil.which("machina-toolhost")
    if found is None:
        raise RuntimeError("machina-toolhost is not installed (pip install .)")
    return found


TOOLHOST = find_toolhost()


def elf_interpreter(path: str | Path) -> str | None:
    """The program interpreter (dynamic loader) an ELF executable names, or None for a
    statically linked one."""
    import struct

    with open(path, "rb") as f:
        head = f.read(64)
        assert head[:4] == b"\x7fELF" and head[4] == 2, f"{path}: not a 64-bit ELF file"
        phoff, = struct.unpack_from("<Q", head, 32)
        phentsize, phnum = struct.unpack_from("<HH", head, 54)
        for i in range(phnum):
            f.seek(phoff + i * phentsize)
            p_type, _, p_offset, _, _, p_filesz = struct.unpack("<IIQQQQ", f.read(40))
            if p_type == 3:  # PT_INTERP
                f.seek(p_offset)
                return f.read(p_filesz).rstrip(b"\0").decode()
    return None


# The build links machina-toolhost fully statically, with the built-in tools in it,
# wherever it can (not in the sanitizer build): see docs/operations.md.
STATIC_FRONT = elf_interpreter(TOOLHOST) is None


@pytest.fixture(scope="session", autouse=True)
def _state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The hosts the tests start keep their per-user state (the default audit store) in a
    folder of the session's, never in the real home."""
    before = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("xdg-state"))
    yield
    if before is None:
        os.environ.pop("XDG_STATE_HOME", None)
    else:
        os.environ["XDG_STATE_HOME"] = before


@pytest.fixture(scope="session")
def test_plugins(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Builds tests/plugins once per session; maps plugin name -> .so path."""
    build = tmp_path_factory.mktemp("test-plugins")
    cmake = shutil.which("cmake") or "cmake"
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    # In the sanitizer run the test plugins are instrumented too (same compiler, same flags).
    flags = ([f"-DCMAKE_C_COMPILER={os.environ['CC']}", f"-DCMAKE_CXX_COMPILER={os.environ['CXX']}",
              f"-DCMAKE_C_FLAGS={os.environ.get('MACHINA_TEST_SANITIZE_FLAGS', '')}",
              f"-DCMAKE_CXX_FLAGS={os.environ.get('MACHINA_TEST_SANITIZE_FLAGS', '')}"]
             if SANITIZED else [])
    subprocess.run(
        [cmake, "-S", str(TEST_PLUGIN_SRC), "-B", str(build), *gen,
         f"-DMACHINA_PLUGIN_INCLUDE={machina_dispatch.get_include()}",
         "-DCMAKE_BUILD_TYPE=Release", *flags],
        check=True, capture_output=True,
    )
    subprocess.run([cmake, "--build", str(build), "-j2"], check=True, capture_output=True)
    return {p.stem: str(p) for p in build.glob("*.so")}


@pytest.fixture(scope="session")
def misbehaving(test_plugins: dict[str, str]) -> str:
    return test_plugins["misbehaving_tools"]


@pytest.fixture
def plugins(misbehaving: str) -> list[str]:
    """The misbehaving test tools and the built-in pack (modules may define their own)."""
    return [misbehaving, str(machina_dispatch.builtin_plugin_path())]


@pytest.fixture
def no_orphans() -> Iterator[None]:
    """Fails the test if it leaves a machina-toolhost process of its own behind."""
    from dispatch_support import orphans_since, toolhost_processes

    before = toolhost_processes()
    yield
    left = orphans_since(before)
    assert not left, f"machina-toolhost processes left behind: {left}"


# scripts/sanitize-tests.sh runs the suite against an ASan+UBSan build. The Python
# process itself runs without leak checking (the interpreter keeps memory to the end);
# the hosts the tests start get the options in MACHINA_TEST_CHILD_ASAN_OPTIONS, leak
# checking included.
SANITIZED = os.environ.get("MACHINA_TEST_SANITIZED") == "1"
CHILD_ASAN_OPTIONS = os.environ.get("MACHINA_TEST_CHILD_ASAN_OPTIONS")
not_sanitized = pytest.mark.skipif(SANITIZED, reason="builds the project itself: run by the normal suite, not the "
                                                     "sanitizer run")

# Wall-clock bounds. A test asserts an upper bound on how long something took only where
# no better evidence exists (overlap is shown by stamps, a deadline by its error code and
# a lower bound); such a bound is scaled by MACHINA_TEST_TIME_SCALE (default 1; the
# sanitizer run sets more), so that a slow machine or build cannot fail a correct host.
TIME_SCALE = float(os.environ.get("MACHINA_TEST_TIME_SCALE", "1"))
HANG_GUARD_S = 10.0  # against a wait that never ends (scaled: see scaled())


def scaled(seconds: float) -> float:
    """An upper bound of `seconds` on a wall-clock wait, scaled by MACHINA_TEST_TIME_SCALE."""
    return seconds * TIME_SCALE


# How long a tool sleeps, or a deadline or timeout lasts, where a test shows that something
# else ends the call first: past the scaled guard, so that a call left to it fails the test.
PAST_GUARD_MS = int(scaled(HANG_GUARD_S) * 1000) + 5000
PAST_GUARD_S = PAST_GUARD_MS / 1000


def most_at_once(outputs: Iterable[Mapping[str, Any]]) -> int:
    """How many of the calls that reported these stamps ran at one moment, at most. The
    stamps (``started_ns``, ``ended_ns``) are CLOCK_MONOTONIC, the clock of
    ``time.monotonic_ns()``; AID.TEST.SLOW.v1 reports them given ``"stamps": 1``. Calls run
    one after another give 1; calls that all overlap give their number."""
    stamps = list(outputs)
    events = sorted([(o["ended_ns"], -1) for o in stamps] + [(o["started_ns"], 1) for o in stamps])
    running = most = 0
    for _, step in events:  # at one instant, an end sorts before a start: touching is not overlapping
        running += step
        most = max(most, running)
    return most


def skip_where_unconfinable(answers: Iterable[dict[str, Any]]) -> None:
    """Skips the calling test (or module fixture) when a pack refused to run code because this
    kernel cannot build its sandbox ("... cannot be confined ..."); any other answer is left
    for the caller to assert on."""
    for a in answers:
        if not a["ok"] and a.get("code") == "system_error" and "cannot be confined" in a["error"]:
            pytest.skip(a["error"])


def base_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MACHINA_")}
    if CHILD_ASAN_OPTIONS:
        env["ASAN_OPTIONS"] = CHILD_ASAN_OPTIONS
    if extra:
        env.update(extra)
    return env


def as_line(request: Any) -> bytes:
    if isinstance(request, bytes):
        return request
    if isinstance(request, str):
        return request.encode()
    return json.dumps(request).encode()


def run(aid: str, stdin: Any = b"{}", *args: str, env: Mapping[str, str] | None = None,
        timeout: float = 30) -> subprocess.CompletedProcess[bytes]:
    """machina-toolhost [args] --run AID with `stdin` (bytes, str or a JSON-able object)."""
    return subprocess.run([TOOLHOST, *args, "--run", aid], input=as_line(stdin),
                          capture_output=True, env=base_env(env), timeout=timeout)


def run_json(aid: str, stdin: Any = b"{}", *args: str, **kw: Any) -> dict[str, Any]:
    proc = run(aid, stdin, *args, **kw)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    answer: dict[str, Any] = json.loads(lines[0])
    return answer


def serve_raw(data: bytes, *args: str, env: Mapping[str, str] | None = None,
              timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([TOOLHOST, *args, "--serve"], input=data, capture_output=True,
                          env=base_env(env), timeout=timeout)


def serve(requests: Iterable[Any], *args: str, env: Mapping[str, str] | None = None,
          timeout: float = 60) -> list[dict[str, Any]]:
    """Sends each request as one line to `--serve`; returns the parsed response lines."""
    data = b"".join(as_line(r) + b"\n" for r in requests)
    proc = serve_raw(data, *args, env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def echo(input_obj: Any = None, **fields: Any) -> dict[str, Any]:
    """An echo request; `fields` adds envelope fields (id, idempotency_key, ...)."""
    req: dict[str, Any] = {"aid": "AID.ECHO.v1"}
    if input_obj is not None:
        req["input_json"] = json.dumps(input_obj)
    req.update(fields)
    return req


EMPTY_DELTA = {"delta": True, "slots": {}, "removed_slots": []}


def ok_response(output_json: str, ds_state: Any = None, **extra: Any) -> dict[str, Any]:
    r: dict[str, Any] = {"ok": True, "status": "OK", "output_json": output_json, "error": "",
                         "ds_state": EMPTY_DELTA if ds_state is None else ds_state}
    r.update(extra)
    return r


def status_error(status: str, code: str, error: str, ds_state: Any = None, **extra: Any) -> dict[str, Any]:
    r: dict[str, Any] = {"ok": False, "status": status, "output_json": "", "error": error,
                         "code": code, "ds_state": EMPTY_DELTA if ds_state is None else ds_state}
    r.update(extra)
    return r


# The dispatch contract's status each refusal carries (a refusal: no output_json, no ds_state).
# The hints beside a refusal's error (what the caller can do about it).
LIST_HINT = "the tool list (--list) names every tool"


def near_hint(aid: str) -> str:
    return f"did you mean {aid}? " + LIST_HINT[0].upper() + LIST_HINT[1:]


def lease_hint(aid: str, tier: int) -> str:
    return (f"a tier-{tier} tool runs only with a single-use lease: the operator issues one with "
            f"`machina-toolhost lease issue --aid {aid}` (with the host's lease secret) and the request sends "
            "it as `_lease_token`")


REFUSAL_STATUS = {
    "request_too_large": "INVALID_PICK", "malformed_request": "INVALID_PICK", "invalid_ds_state": "INVALID_PICK",
    "tool_not_found": "INVALID_PICK", "lease_required": "TOOL_ERROR", "lease_rejected": "TOOL_ERROR",
    "idempotency_conflict": "TOOL_ERROR", "overloaded": "TOOL_ERROR", "internal_error": "TOOL_ERROR",
}


def plain_error(code: str, error: str, **extra: Any) -> dict[str, Any]:
    """A refusal: the request never reached the tool's own rules."""
    r: dict[str, Any] = {"ok": False, "status": REFUSAL_STATUS[code], "error": error, "code": code}
    r.update(extra)
    return r


sys.path.insert(0, str(Path(__file__).resolve().parent))

import process_tree  # noqa: E402  (found through the path just added)

# Orphans of what the tests start stay in this process's tree (see process_tree.py).
process_tree.make_this_process_a_subreaper()
