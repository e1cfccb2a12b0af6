"""pytest-benchmark micro-suite for the hot functions, through the compiled module:

    pip install '.[bench]'
    python -m pytest bench/micro                       # timings (pytest-benchmark tables)
    python -m pytest bench/micro --benchmark-disable   # each once, as a check (what CI does)

Not part of the test suite's timing gates: machines are noisy; compare runs on one machine
(e.g. --benchmark-autosave, then --benchmark-compare).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import machina_dispatch as md
import pytest
from machina_dispatch import _core

try:
    from machina_dispatch import _testing
except ImportError as e:  # a build without the hooks (a plain `pip install .`, the wheel)
    raise ImportError("machina_dispatch._testing is missing: install with the test hooks "
                      "(scripts/install.sh test, or pip install -C cmake.define.MACHINA_TESTING_HOOKS=ON)") from e

ECHO = json.dumps({"aid": "AID.ECHO.v1", "input_json": json.dumps({"msg": "hello", "n": 1})})
SECRET = "micro-benchmark-secret-0123456789abcdef"


@pytest.fixture(scope="module")
def host() -> md.Host:
    return md.Host()


def test_request_decode(benchmark: Any) -> None:
    """The wire request decoder alone (RapidJSON fast path)."""
    r = benchmark(_testing.decode_request, ECHO)
    assert r[0] is True


def test_serve_line_round_trip(benchmark: Any, host: md.Host) -> None:
    """One --serve line: decode, the host's rules, the echo tool, response encode."""
    session = md.Session()
    out = benchmark(host.call_json, ECHO, session)
    assert json.loads(out)["ok"] is True


def test_response_encode_large_output(benchmark: Any, host: md.Host) -> None:
    """Response encoding dominated by escaping a 64 KiB output string."""
    request = json.dumps({"aid": "AID.ECHO.v1", "input_json": json.dumps("a\"b\\c\n" * 10_000)})
    session = md.Session()
    out = benchmark(host.call_json, request, session)
    assert json.loads(out)["ok"] is True


def test_idempotency_cache_hit(benchmark: Any, host: md.Host) -> None:
    """A repeated key: fingerprint, lookup, cached response (the tool does not run)."""
    request = json.dumps({"aid": "AID.ECHO.v1", "input_json": "[1]", "idempotency_key": "micro-hit"})
    session = md.Session()
    host.call_json(request, session)
    out = benchmark(host.call_json, request, session)
    assert json.loads(out)["idempotent_hit"] is True


@pytest.fixture(scope="module")
def enforcing_host() -> Iterator[md.Host]:
    saved = {k: os.environ.get(k) for k in ("MACHINA_LEASE_ENFORCE", "MACHINA_LEASE_SECRET")}
    os.environ["MACHINA_LEASE_ENFORCE"] = "1"
    os.environ["MACHINA_LEASE_SECRET"] = SECRET
    try:
        yield md.Host()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_lease_verify(benchmark: Any, enforcing_host: md.Host) -> None:
    """A tier-1 call with a fresh lease each round: signature check (HMAC-SHA256), expiry,
    aid binding and the single-use ledger (shared on disk by all hosts of a user). The
    input fails the schema after the lease gate, so the tool itself does not run."""
    session = md.Session()

    def setup() -> tuple[tuple[str, md.Session], dict[str, Any]]:
        token = md.issue_lease("AID.FILE.WRITE.v1", ttl_s=60, secret=SECRET)
        request = json.dumps({"aid": "AID.FILE.WRITE.v1", "input_json": "{}", "_lease_token": token})
        return (request, session), {}

    out = benchmark.pedantic(enforcing_host.call_json, setup=setup, rounds=2000)
    r = json.loads(out)
    assert r["status"] == "INVALID_PICK" and r["code"] == "schema_violation", r


def test_dispatch_encode(benchmark: Any) -> None:
    """Client side: one request line encoded natively (what Pool sends)."""
    line = benchmark(_core.encode_request, 7, "AID.ECHO.v1", '{"msg":"hello","n":1}', None, None, 30000,
                     '{"slots":{}}')
    assert json.loads(line)["id"] == 7


def test_dispatch_decode(benchmark: Any, host: md.Host) -> None:
    """Client side: one response line decoded into a ToolResult."""
    line = host.call_json(ECHO, md.Session()).encode()
    r = benchmark(_core.decode_response, line, "AID.ECHO.v1")
    assert r.ok and r.output == {"msg": "hello", "n": 1}


def test_dispatch_decode_batch(benchmark: Any, host: md.Host) -> None:
    """Client side: 1000 pipelined response lines with ids decoded in one call."""
    lines = b"".join(host.call_json(json.dumps({"id": i, "aid": "AID.ECHO.v1", "input_json": "[1]"}),
                                    md.Session()).encode() + b"\n" for i in range(1000))
    aids = {i: "AID.ECHO.v1" for i in range(1000)}

    def decode() -> int:
        results, used = _core.decode_responses(lines, 0, dict(aids))
        return len(results)

    assert benchmark(decode) == 1000
