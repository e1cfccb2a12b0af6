"""The idempotency cache is bounded in keys, bytes and entries (a red team took a host to
2.7 GiB with 300 unique 9 MiB keys), and never evicts an entry for a call still running
(an evicted one let a duplicate run the tool a second time)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from conftest import SANITIZED, TOOLHOST, base_env, serve


def echo(key: str, text: str, rid: Any = None) -> dict[str, Any]:
    r: dict[str, Any] = {"aid": "AID.ECHO.v1", "input_json": json.dumps({"t": text}), "idempotency_key": key}
    if rid is not None:
        r["id"] = rid
    return r


def test_a_key_longer_than_the_cap_is_refused() -> None:
    first, again, too_long = serve([echo("k" * 1024, "a"), echo("k" * 1024, "a"), echo("k" * 1025, "a")])
    assert first["ok"] is True and again.get("idempotent_hit") is True  # 1024 bytes: the default cap
    assert too_long == {"ok": False, "status": "INVALID_PICK", "code": "malformed_request",
                        "error": "malformed request: idempotency_key is longer than 1024 bytes"}
    [capped] = serve([echo("k" * 17, "a")], "--idempotency-max-key-bytes", "16")
    assert capped == {"ok": False, "status": "INVALID_PICK", "code": "malformed_request",
                      "error": "malformed request: idempotency_key is longer than 16 bytes"}


def test_stored_results_are_bounded_in_bytes_oldest_first() -> None:
    # Five 1 MB results in a 3.5 MB budget: the three newest are kept, the two oldest went.
    mb = "x" * 1_000_000
    keys = [f"k{i}" for i in range(5)]
    # (Asked newest first: a miss stores its new result, which would push out the others.)
    out = serve([echo(k, mb) for k in keys] + [echo(k, mb) for k in reversed(keys)],
                "--idempotency-max-bytes", "3500000", "--max-output-bytes", "2000000")
    assert all(r["ok"] for r in out)
    assert [r.get("idempotent_hit", False) for r in out[5:]] == [True, True, True, False, False]


def test_unique_keys_do_not_grow_the_host_past_its_byte_budget() -> None:
    # 300 unique keys with 1 MB results each (300 MB, were all kept) and an 8 MiB budget.
    host = subprocess.Popen([TOOLHOST, "--serve", "--idempotency-max-bytes", str(8 << 20),
                             "--max-output-bytes", "2000000"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env=base_env())
    assert host.stdin is not None and host.stdout is not None
    mb = "y" * 1_000_000
    for i in range(300):
        host.stdin.write(json.dumps(echo(f"key-{i}", mb)).encode() + b"\n")
        host.stdin.flush()
        assert json.loads(host.stdout.readline())["ok"] is True
    rss_kib = int(next(line.split()[1] for line in Path(f"/proc/{host.pid}/status").read_text().splitlines()
                       if line.startswith("VmRSS:")))
    host.stdin.close()
    host.wait(timeout=30)
    bound_mib = 256 if SANITIZED else 96  # ASan keeps freed memory in quarantine for a while
    assert rss_kib < bound_mib * 1024, f"host RSS {rss_kib / 1024:.0f} MiB"


def test_a_running_entry_is_never_evicted(misbehaving: str) -> None:
    # One entry, and it is a call still running: a new key is refused (overloaded), and a
    # duplicate of the running call waits for it instead of running the tool again.
    host = subprocess.Popen([TOOLHOST, "--serve", "--workers", "3", "--idempotency-max-entries", "1",
                             "--plugin", misbehaving], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=base_env())
    assert host.stdin is not None and host.stdout is not None

    def send(req: dict[str, Any]) -> None:
        assert host.stdin is not None
        host.stdin.write(json.dumps(req).encode() + b"\n")
        host.stdin.flush()

    send({"id": 1, "aid": "AID.TEST.SLOW.v1", "input_json": '{"ms": 700}', "idempotency_key": "running"})
    time.sleep(0.2)
    send({"id": 2, "aid": "AID.TEST.COUNTER.v1", "idempotency_key": "another"})
    send({"id": 3, "aid": "AID.TEST.SLOW.v1", "input_json": '{"ms": 700}', "idempotency_key": "running"})
    out, _ = host.communicate(timeout=30)
    by_id = {r["id"]: r for r in map(json.loads, out.splitlines())}
    assert by_id[2] == {"id": 2, "ok": False, "status": "TOOL_ERROR", "code": "overloaded",
                        "error": "overloaded: all 1 idempotency entries are calls still running; new keys are "
                                 "refused until one finishes"}
    assert json.loads(by_id[1]["output_json"]) == {"slept_ms": 700, "calls": 1}
    assert by_id[3]["idempotent_hit"] is True and by_id[3]["output_json"] == by_id[1]["output_json"]
    # Once it finished, its entry is a kept result like any other: a new key may take it.
    [later] = serve([{"aid": "AID.TEST.COUNTER.v1", "idempotency_key": "another"}], "--plugin", misbehaving,
                    "--idempotency-max-entries", "1")
    assert later["ok"] is True
