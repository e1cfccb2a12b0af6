"""The shared idempotency store of the native NATS front (`machina-toolhost --nats URL
--nats-idempotency kv --kv-key-file F`): a JetStream key-value bucket through which the hosts
of a group run each idempotency key's tool once, whichever host a call lands on; a conflict
across hosts; entries signed with the group's key (a forged or moved entry is neither
replayed nor run over, and is counted); a claim whose host died answers "outcome unknown"
and never runs the tool again; a replay passes the lease gate and is audited; an answer too
large for the bucket; the key file required. Driven over NATS against a real nats-server."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import machina_dispatch as md
import nats
import pytest
from conftest import HANG_GUARD_S, LEASE_SECRET, TOOLHOST, base_env, scaled
from nats_support import Front, nats_server, write_kv_key
from python_support import python_tool, write_pack

MARK = "AID.PY.MARK.v1"
ECHO = "AID.ECHO.v1"


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with nats_server() as u:
        yield u


def mark_pack(tmp_path: Path, tier: int = 0) -> Path:
    return write_pack(tmp_path / "pack", [python_tool(MARK, "tools.sample_tool:sleep", tier=tier)])


def runs(mark: Path) -> int:
    return mark.read_text().count("ran\n") if mark.exists() else 0


def envelope(input_json: str, key: str, aid: str = MARK, **fields: Any) -> dict[str, Any]:
    return {"aid": aid, "input_json": input_json, "idempotency_key": key, **fields}


def store_key(aid: str, idempotency_key: str) -> str:
    """The store's key for a tool's idempotency key (a plain hash: anyone can compute it)."""
    return "k" + hashlib.sha256(f"{aid}\0{idempotency_key}".encode()).hexdigest()


def kv_args(tmp_path: Path, bucket: str, *more: str, key: Path | None = None) -> list[str]:
    return ["--nats-idempotency", "kv", "--nats-kv-bucket", bucket,
            "--kv-key-file", str(key or write_kv_key(tmp_path / "kv.key")), *more]


async def _request(nc: Any, subject: str, body: dict[str, Any] | bytes, timeout: float) -> dict[str, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    msg = await nc.request(subject, data, timeout=timeout)
    answer: dict[str, Any] = json.loads(msg.data)
    return answer


def request(url: str, subject: str, body: dict[str, Any] | bytes, timeout: float = 10) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        nc = await nats.connect(url)
        try:
            return await _request(nc, subject, body, timeout)
        finally:
            await nc.close()
    return asyncio.run(go())


def request_many(url: str, subject: str, bodies: list[dict[str, Any]], timeout: float = 20) -> list[dict[str, Any]]:
    async def go() -> list[dict[str, Any]]:
        nc = await nats.connect(url)
        try:
            return list(await asyncio.gather(*(_request(nc, subject, b, timeout) for b in bodies)))
        finally:
            await nc.close()
    return asyncio.run(go())


def put_entry(url: str, bucket: str, key: str, entry: bytes) -> None:
    async def go() -> None:
        nc = await nats.connect(url)
        try:
            await (await nc.jetstream().key_value(bucket)).put(key, entry)
        finally:
            await nc.close()
    asyncio.run(go())


def get_entry(url: str, bucket: str, key: str) -> bytes:
    async def go() -> bytes:
        nc = await nats.connect(url)
        try:
            entry = await (await nc.jetstream().key_value(bucket)).get(key)
            return entry.value or b""
        finally:
            await nc.close()
    return asyncio.run(go())


def stats(url: str, front: Front) -> dict[str, Any]:
    return request(url, f"$SRV.STATS.machina-toolhost.{front.service_id}", b"")


def rejected_entries(url: str, front: Front) -> int:
    """The host's count of store entries that failed their check (the same in every endpoint's data)."""
    counts = {int((ep.get("data") or {})["idempotency_entries_rejected"]) for ep in stats(url, front)["endpoints"]}
    assert len(counts) == 1, counts
    return counts.pop()


def test_two_hosts_of_a_group_run_a_key_once(url: str, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    args = ["--nats-prefix", "once", "--tools", str(mark_pack(tmp_path)), *kv_args(tmp_path, "once_idem")]
    with Front(url, args, log_dir=tmp_path) as a, Front(url, args, log_dir=tmp_path) as b:
        text = json.dumps({"s": 0.5, "mark": str(marks / "k1")})
        answers = request_many(url, "once.call", [envelope(text, "k1") for _ in range(16)])
        assert all(r["ok"] for r in answers), answers
        assert len({r["output_json"] for r in answers}) == 1, answers  # one run's answer (its pid) for all
        assert sum(1 for r in answers if not r.get("idempotent_hit")) == 1, answers
        assert runs(marks / "k1") == 1
        # The calls were shared by both hosts (a queue group), and the one run was on one of them.
        served = [sum(ep["num_requests"] for ep in stats(url, f)["endpoints"]) for f in (a, b)]
        assert all(n > 0 for n in served), served
        # Later, on either host: the kept answer.
        again = request_many(url, "once.call", [envelope(text, "k1") for _ in range(6)])
        assert all(r["idempotent_hit"] and r["output_json"] == answers[0]["output_json"] for r in again), again
        # The same key with another input is a conflict, on whichever host it lands.
        other = json.dumps({"s": 0, "mark": str(marks / "other")})
        conflicts = request_many(url, "once.call", [envelope(other, "k1") for _ in range(6)])
        assert all(r["code"] == "idempotency_conflict" for r in conflicts), conflicts
        assert runs(marks / "k1") == 1 and runs(marks / "other") == 0
        # The same key for another tool is another key (as in the host's own cache).
        echo = request(url, "once.call", envelope('{"x":1}', "k1", aid=ECHO))
        assert echo["ok"] and echo["output_json"] == '{"x":1}' and not echo.get("idempotent_hit"), echo
    assert runs(marks / "k1") == 1


def test_an_answer_not_kept_lets_a_retry_run(url: str, tmp_path: Path) -> None:
    """The host's one keep rule: a timed-out call keeps no answer, so its key runs again."""
    marks = tmp_path / "marks"
    marks.mkdir()
    args = ["--nats-prefix", "keep", "--tools", str(mark_pack(tmp_path)), "--packs", "none",
            *kv_args(tmp_path, "keep_idem")]
    with Front(url, args, log_dir=tmp_path):
        slow = json.dumps({"s": 0.6, "mark": str(marks / "slow")})
        r = request(url, "keep.call", envelope(slow, "t1", timeout_ms=200))
        assert r["code"] == "timeout", r
        time.sleep(0.6)
        r = request(url, "keep.call", envelope(slow, "t1", timeout_ms=5000))
        assert r["ok"] and not r.get("idempotent_hit"), r
        assert runs(marks / "slow") == 1  # (the first was stopped at its deadline, before its mark)


def test_a_forged_entry_is_never_replayed_and_never_runs_the_tool(url: str, tmp_path: Path) -> None:
    bucket = "forge_idem"
    marks = tmp_path / "marks"
    marks.mkdir()
    args = ["--nats-prefix", "forge", "--tools", str(mark_pack(tmp_path)), "--packs", "none",
            *kv_args(tmp_path, bucket)]
    with Front(url, args, log_dir=tmp_path) as front:
        # A genuine answer is stored and replayed (one run).
        genuine = json.dumps({"s": 0, "mark": str(marks / "genuine")})
        first = request(url, "forge.call", envelope(genuine, "genuine-key"))
        again = request(url, "forge.call", envelope(genuine, "genuine-key"))
        assert first["ok"] and not first.get("idempotent_hit") and again.get("idempotent_hit") is True, again
        assert again["output_json"] == first["output_json"] and runs(marks / "genuine") == 1
        assert rejected_entries(url, front) == 0

        # A client writes a "done" entry with a fingerprint anyone can compute.
        forged_input = json.dumps({"s": 0, "mark": str(marks / "forged")})
        fingerprint = hashlib.sha256(f"{MARK}\0{forged_input}".encode()).hexdigest()
        forged = {"state": "done", "fp": fingerprint, "response": {"code": "ok", "output_json": '{"forged":true}'}}
        put_entry(url, bucket, store_key(MARK, "victim-key-7f3a"), b"0" * 64 + b" " + json.dumps(forged).encode())
        r = request(url, "forge.call", envelope(forged_input, "victim-key-7f3a"))
        assert r.get("output_json") != '{"forged":true}' and not r.get("idempotent_hit"), r
        assert r["code"] == "internal_error" and "fails its authentication check" in r["error"], r
        assert runs(marks / "forged") == 0  # a real answer may have been overwritten: never run
        assert rejected_entries(url, front) == 1

        # A forged "running" claim does not hold the caller until its far-off end.
        claim = {"state": "running", "fp": fingerprint, "host": "x", "until_ms": int(time.time() * 1000) + 3_600_000}
        put_entry(url, bucket, store_key(MARK, "claimed-key"), json.dumps(claim).encode())
        start = time.monotonic()
        r = request(url, "forge.call", envelope(forged_input, "claimed-key"), timeout=30)
        assert time.monotonic() - start < scaled(HANG_GUARD_S)  # not the claim's far-off end
        assert r["code"] == "internal_error" and "fails its authentication check" in r["error"], r
        assert runs(marks / "forged") == 0
        # A genuine entry copied under another key fails too (the key is part of what is signed).
        put_entry(url, bucket, store_key(MARK, "copied-key"), get_entry(url, bucket, store_key(MARK, "genuine-key")))
        r = request(url, "forge.call", envelope(genuine, "copied-key"))
        assert r["code"] == "internal_error" and "fails its authentication check" in r["error"], r
        assert rejected_entries(url, front) == 3
        assert runs(marks / "genuine") == 1
        log = front.stderr()
    lines = [line for line in log.splitlines() if "authentication check" in line]
    assert len(lines) == 3, log
    assert store_key(MARK, "victim-key-7f3a") in lines[0] and "victim-key-7f3a" not in log


def test_a_claim_whose_host_died_answers_outcome_unknown_and_never_runs(url: str, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    key = write_kv_key(tmp_path / "kv.key")
    pack = mark_pack(tmp_path)
    started = marks / "started"
    text = json.dumps({"s": scaled(5), "mark": str(marks / "dead"), "started": str(started)})
    common = ["--tools", str(pack), "--packs", "none", *kv_args(tmp_path, "dead_idem", "--nats-claim-grace-ms", "500",
                                                                  key=key)]
    with Front(url, ["--nats-prefix", "dying", *common], log_dir=tmp_path) as dying, \
            Front(url, ["--nats-prefix", "alive", *common], log_dir=tmp_path):
        async def first() -> None:
            nc = await nats.connect(url)
            try:
                with pytest.raises(Exception):  # noqa: B017 (its host dies: no answer)
                    await _request(nc, "dying.call", envelope(text, "dead-key", timeout_ms=1500), 8)
            finally:
                await nc.close()

        async def scenario() -> dict[str, Any]:
            pending = asyncio.ensure_future(first())
            deadline = time.monotonic() + 10
            while not started.exists():
                assert time.monotonic() < deadline, "the first call did not start"
                await asyncio.sleep(0.02)
            claimed_at = time.monotonic()
            dying.kill()  # SIGKILL, the claim in the store
            pending.cancel()
            started.unlink()
            nc = await nats.connect(url)
            try:
                r = await _request(nc, "alive.call", envelope(text, "dead-key", timeout_ms=1500), 15)
            finally:
                await nc.close()
            waited = time.monotonic() - claimed_at
            assert 1.2 < waited < scaled(4.5), waited  # the claim's end (deadline + grace), not the tool's sleep
            return r

        r = asyncio.run(scenario())
        assert r["code"] == "tool_crashed" and "whether the tool ran is unknown" in r["error"], r
        assert not started.exists()  # the surviving host did not start the tool
        # And later calls with the key are told the same at once, without running it.
        start = time.monotonic()
        r = request(url, "alive.call", envelope(text, "dead-key", timeout_ms=1500))
        assert r["code"] == "tool_crashed" and time.monotonic() - start < scaled(1), r
        assert not started.exists()


def test_a_replay_from_the_shared_store_needs_a_lease_and_is_audited(url: str, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    store = tmp_path / "audit" / "calls.db"
    store.parent.mkdir()
    env = {"MACHINA_LEASE_ENFORCE": "1", "MACHINA_LEASE_SECRET": LEASE_SECRET,
           "MACHINA_LEASE_LEDGER": str(tmp_path / "ledger")}
    key = write_kv_key(tmp_path / "kv.key")
    common = ["--tools", str(mark_pack(tmp_path, tier=2)), "--packs", "none", *kv_args(tmp_path, "lease_idem", key=key)]
    text = json.dumps({"s": 0, "mark": str(marks / "once")})
    # The answer is kept by one host; the replays are asked of another, with its own audit store.
    with Front(url, ["--nats-prefix", "first", *common], env=env, log_dir=tmp_path):
        first = request(url, "first.call", envelope(text, "K", _lease_token=md.issue_lease(MARK, secret=LEASE_SECRET)))
        assert first["ok"] and runs(marks / "once") == 1, first
    with Front(url, ["--nats-prefix", "leased", *common, "--audit-db", str(store)], env=env, log_dir=tmp_path):
        # Another caller repeats the key and input without a lease: refused, as a call is.
        r = request(url, "leased.call", envelope(text, "K"))
        assert r["code"] == "lease_required" and "output_json" not in r, r
        # With a lease of its own: the stored answer, and the lease is used up by it.
        lease = md.issue_lease(MARK, 30, secret=LEASE_SECRET)
        r = request(url, "leased.call", envelope(text, "K", _lease_token=lease, user="bob"))
        assert r["ok"] and r["idempotent_hit"] is True and r["output_json"] == first["output_json"], r
        r = request(url, "leased.call", envelope(text, "K", _lease_token=lease))
        assert r["code"] == "lease_rejected" and r["reason"] == "consumed", r
        assert runs(marks / "once") == 1
    con = sqlite3.connect(store)
    con.row_factory = sqlite3.Row
    rows = [dict(x) for x in con.execute("SELECT * FROM call_log ORDER BY id")]
    con.close()
    assert [(x["front"], x["tool"], x["code"], x["idempotent_hit"]) for x in rows] == [
        ("nats", MARK, "lease_required", 0), ("nats", MARK, "ok", 1), ("nats", MARK, "lease_rejected", 0)], rows
    assert rows[1]["user"] == "bob"


def test_an_answer_too_large_for_the_bucket_is_not_replayed_nor_run_again(tmp_path: Path) -> None:
    """The bucket keeps values up to the server's largest message less room for headers: a
    larger answer reaches its caller, and a later call with the key is told it was too large
    to keep (output_too_large), without the tool running again."""
    bucket = "large_idem"
    with nats_server(max_payload=65536) as url:
        args = ["--nats-prefix", "large", *kv_args(tmp_path, bucket, "--nats-kv-ttl-s", "120")]
        with Front(url, args, log_dir=tmp_path):
            big = json.dumps({"msg": '"' * 15_500})  # each quote 4 bytes in the answer: under 64 KiB, over the limit
            first = request(url, "large.call", envelope(big, "big", aid=ECHO))
            assert first["ok"] and first["output_json"] == big, {k: v for k, v in first.items() if k != "output_json"}
            again = request(url, "large.call", envelope(big, "big", aid=ECHO))
            assert again["code"] == "output_too_large" and again["idempotent_hit"] is True, again
            assert "not run again" in again["error"], again
            small = request(url, "large.call", envelope('{"msg":"x"}', "small", aid=ECHO))
            small_again = request(url, "large.call", envelope('{"msg":"x"}', "small", aid=ECHO))
            assert small_again["idempotent_hit"] and small_again["output_json"] == small["output_json"]

            async def config() -> Any:
                nc = await nats.connect(url)
                try:
                    return (await nc.jetstream().stream_info(f"KV_{bucket}")).config
                finally:
                    await nc.close()
            c = asyncio.run(config())
            assert c.max_age == 120 and c.max_msgs_per_subject == 1 and c.max_msg_size == 65536 - 4096, c


def test_the_shared_store_needs_a_key_file(url: str, tmp_path: Path) -> None:
    def start(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [TOOLHOST, "--nats", url, "--packs", "none", *args]
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=10, env=base_env())
        except subprocess.TimeoutExpired as e:  # it started serving
            return subprocess.CompletedProcess(argv, -1, "", str(e.stderr or ""))
    r = start("--nats-idempotency", "kv")
    assert r.returncode == 2 and "--kv-key-file" in r.stderr, r.stderr
    short = tmp_path / "short.key"
    short.write_text("0123456789\n")
    r = start("--nats-idempotency", "kv", "--kv-key-file", str(short))
    assert r.returncode == 2 and "at least 32 bytes" in r.stderr, r.stderr
    r = start("--nats-idempotency", "kv", "--kv-key-file", str(tmp_path / "missing.key"))
    assert r.returncode == 2 and "missing.key" in r.stderr, r.stderr
    r = start("--nats-idempotency", "shared")
    assert r.returncode != 0 and "--nats-idempotency" in r.stderr, r.stderr
