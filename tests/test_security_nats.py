"""A hostile client of the NATS server the hosts use, against the group's shared
idempotency store (--idempotency kv): it cannot forge an answer or a claim in the store, a
replay from the store passes the lease gate and is audited as a call is, and no reply
subject a client names makes a host write into the store. Driven over NATS as any client
would, so that it holds for every implementation of the front."""

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
from conftest import LEASE_SECRET
from nats_support import Front, front_binary, nats_server, write_kv_key
from python_support import python_tool, write_pack

MARK = "AID.PY.MARK.v1"


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with nats_server() as u:
        yield u


def mark_pack(tmp_path: Path, tier: int = 0) -> Path:
    return write_pack(tmp_path / "pack", [python_tool(MARK, "tools.sample_tool:sleep", tier=tier)])


def runs(mark: Path) -> int:
    return mark.read_text().count("ran\n") if mark.exists() else 0


def envelope(input_json: str, key: str, **fields: Any) -> dict[str, Any]:
    return {"aid": MARK, "input_json": input_json, "idempotency_key": key, **fields}


def request(url: str, subject: str, body: dict[str, Any] | bytes, timeout: float = 10) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        nc = await nats.connect(url)
        try:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            msg = await nc.request(subject, data, timeout=timeout)
            answer: dict[str, Any] = json.loads(msg.data)
            return answer
        finally:
            await nc.close()
    return asyncio.run(go())


def kv_key(idempotency_key: str) -> str:
    """The store's key for an idempotency key (a plain hash: anyone can compute it)."""
    return "k" + hashlib.sha256(idempotency_key.encode()).hexdigest()


def put_entry(url: str, bucket: str, key: str, entry: bytes) -> None:
    async def go() -> None:
        nc = await nats.connect(url)
        try:
            kv = await nc.jetstream().key_value(bucket)
            await kv.put(key, entry)
        finally:
            await nc.close()
    asyncio.run(go())


def stored_keys(url: str, bucket: str) -> list[str]:
    async def go() -> list[str]:
        from nats.js.errors import NoKeysError

        nc = await nats.connect(url)
        try:
            kv = await nc.jetstream().key_value(bucket)
            try:
                return list(await kv.keys())
            except NoKeysError:
                return []
        finally:
            await nc.close()
    return asyncio.run(go())


def rejected_entries(url: str, front: Front) -> int:
    """The front's count of store entries that failed their check, from $SRV.STATS."""
    stats = request(url, f"$SRV.STATS.machina-toolhost.{front.service_id}", b"")
    return sum(int((ep.get("data") or {}).get("idempotency_entries_rejected", 0)) for ep in stats["endpoints"])


def test_the_shared_store_needs_a_key_file(url: str, tmp_path: Path) -> None:
    def start(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [front_binary(), "--url", url, "--packs", "none", *args]
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=10)
        except subprocess.TimeoutExpired as e:  # it started serving
            return subprocess.CompletedProcess(argv, -1, "", str(e.stderr or ""))
    for shared in (["--idempotency", "kv"], ["--durable", "--stream", "NOKEY"]):
        r = start(*shared)
        assert r.returncode == 2 and "--kv-key-file" in r.stderr, r.stderr
    short = tmp_path / "short.key"
    short.write_text("0123456789\n")
    r = start("--idempotency", "kv", "--kv-key-file", str(short))
    assert r.returncode == 2 and "at least 32 bytes" in r.stderr, r.stderr
    r = start("--idempotency", "kv", "--kv-key-file", str(tmp_path / "missing.key"))
    assert r.returncode == 2 and "missing.key" in r.stderr, r.stderr


def test_a_forged_entry_is_never_replayed_and_never_runs_the_tool(url: str, tmp_path: Path) -> None:
    bucket = "forge_idem"
    marks = tmp_path / "marks"
    marks.mkdir()
    args = ["--prefix", "forge", "--tools", str(mark_pack(tmp_path)), "--packs", "none", "--idempotency", "kv",
            "--kv-bucket", bucket, "--kv-key-file", str(write_kv_key(tmp_path / "kv.key"))]
    with Front(url, args, log_dir=tmp_path) as front:
        # A genuine answer is stored and replayed (one run).
        genuine = json.dumps({"s": 0, "mark": str(marks / "genuine")})
        first = request(url, "forge.call", envelope(genuine, "genuine-key"))
        again = request(url, "forge.call", envelope(genuine, "genuine-key"))
        assert first["ok"] and not first.get("idempotent_hit") and again.get("idempotent_hit") is True, again
        assert again["output_json"] == first["output_json"] and runs(marks / "genuine") == 1

        # A client writes a "done" entry with the fingerprint anyone can compute.
        forged_input = json.dumps({"s": 0, "mark": str(marks / "forged")})
        fingerprint = hashlib.sha256(f"{MARK}\0{forged_input}".encode()).hexdigest()
        forged = {"state": "done", "fp": fingerprint,
                  "response": {"ok": True, "status": "OK", "output_json": '{"forged":true}'}}
        put_entry(url, bucket, kv_key("victim-key-7f3a"), json.dumps(forged).encode())
        r = request(url, "forge.call", envelope(forged_input, "victim-key-7f3a"))
        assert r.get("output_json") != '{"forged":true}' and not r.get("idempotent_hit"), r
        assert r == {"ok": False, "status": "TOOL_ERROR", "code": "internal_error", "error": r["error"]}, r
        assert "fails its authentication check" in r["error"], r
        assert runs(marks / "forged") == 0  # a real answer may have been overwritten: never run
        assert rejected_entries(url, front) == 1

        # A forged "running" claim does not hold the caller until its far-off end.
        claim = {"state": "running", "fp": fingerprint, "host": "x", "until_ms": int(time.time() * 1000) + 3_600_000}
        put_entry(url, bucket, kv_key("claimed-key"), json.dumps(claim).encode())
        start = time.monotonic()
        r = request(url, "forge.call", envelope(forged_input, "claimed-key"), timeout=30)
        assert time.monotonic() - start < 5
        assert r["code"] == "internal_error" and "fails its authentication check" in r["error"], r
        assert runs(marks / "forged") == 0
        # A genuine entry copied under another key fails too (the key is part of what is signed).
        genuine_entry = asyncio.run(_get(url, bucket, kv_key("genuine-key")))
        put_entry(url, bucket, kv_key("copied-key"), genuine_entry)
        r = request(url, "forge.call", envelope(genuine, "copied-key"))
        assert r["code"] == "internal_error" and "fails its authentication check" in r["error"], r
        assert rejected_entries(url, front) == 3
        log = front.stderr()
    lines = [line for line in log.splitlines() if "authentication check" in line]
    assert len(lines) == 3, log
    assert kv_key("victim-key-7f3a") in lines[0] and "victim-key-7f3a" not in log


async def _get(url: str, bucket: str, key: str) -> bytes:
    nc = await nats.connect(url)
    try:
        entry = await (await nc.jetstream().key_value(bucket)).get(key)
        value = entry.value or b""
        return value
    finally:
        await nc.close()


def test_a_replay_from_the_shared_store_needs_a_lease_and_is_audited(url: str, tmp_path: Path) -> None:
    bucket = "lease_idem"
    marks = tmp_path / "marks"
    marks.mkdir()
    store = tmp_path / "audit" / "calls.db"
    store.parent.mkdir()
    env = {"MACHINA_LEASE_ENFORCE": "1", "MACHINA_LEASE_SECRET": LEASE_SECRET,
           "MACHINA_LEASE_LEDGER": str(tmp_path / "ledger")}
    args = ["--prefix", "leased", "--tools", str(mark_pack(tmp_path, tier=2)), "--packs", "none",
            "--idempotency", "kv", "--kv-bucket", bucket, "--audit-db", str(store),
            "--kv-key-file", str(write_kv_key(tmp_path / "kv.key"))]
    text = json.dumps({"s": 0, "mark": str(marks / "once")})
    with Front(url, args, env=env, log_dir=tmp_path):
        first = request(url, "leased.call", envelope(text, "K", _lease_token=md.issue_lease(MARK, secret=LEASE_SECRET)))
        assert first["ok"] and runs(marks / "once") == 1, first
        # Another caller repeats the key and input without a lease: refused, as a call is.
        r = request(url, "leased.call", envelope(text, "K"))
        assert r == {"ok": False, "status": "TOOL_ERROR", "error": "lease_required", "code": "lease_required",
                     "tier": 2, "aid": MARK}, r
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
        ("nats", MARK, "ok", 0), ("nats", MARK, "lease_required", 0), ("nats", MARK, "ok", 1),
        ("nats", MARK, "lease_rejected", 0)], rows
    assert rows[2]["user"] == "bob"


def test_no_reply_subject_makes_a_host_write_into_the_store(url: str, tmp_path: Path) -> None:
    """A client names the reply subject of its request (and the durable mode's
    Machina-Reply-To header): a host publishes its answers nowhere under `$` (JetStream's
    API, the key-value store, the system), where its own permissions would let it write."""
    bucket = "reply_idem"
    args = ["--prefix", "reply", "--packs", "none", "--durable", "--stream", "REPLY", "--kv-bucket", bucket,
            "--kv-key-file", str(write_kv_key(tmp_path / "kv.key"))]
    target = f"$KV.{bucket}.kforged"

    async def go() -> None:
        nc = await nats.connect(url)
        try:
            body = json.dumps({"aid": "AID.ECHO.v1", "input_json": '{"x":1}'}).encode()
            await nc.publish("reply.call", body, reply=target)
            await nc.publish("$SRV.PING", b"", reply=target)
            await nc.jetstream().publish("reply.durable.call", body,
                                         headers={"Nats-Msg-Id": "r1", "Machina-Reply-To": target})
            # Answers that are allowed still go out.
            assert json.loads((await nc.request("reply.call", body, timeout=10)).data)["output_json"] == '{"x":1}'
            await asyncio.sleep(1.0)  # the durable call's answer, had it gone out
        finally:
            await nc.close()
    with Front(url, args, log_dir=tmp_path) as front:
        asyncio.run(go())
        assert "kforged" not in stored_keys(url, bucket)
        assert front.stderr().count("not answered") == 3, front.stderr()


def documented_server_config() -> str:
    """The nats-server configuration docs/nats.md recommends."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "nats.md").read_text()
    return text.split("```conf\n", 1)[1].split("```", 1)[0]


def test_the_documented_permissions_serve_clients_and_keep_them_out_of_the_store(tmp_path: Path) -> None:
    passwords = {"NATS_HOST_PASSWORD": "host-pw-2b7e", "NATS_ALICE_PASSWORD": "alice-pw-9c1d"}
    inbox = {"inbox_prefix": "_INBOX.alice"}
    with nats_server(config=documented_server_config(), env=passwords) as url:
        as_host = url.replace("nats://", "nats://host:host-pw-2b7e@")
        as_alice = url.replace("nats://", "nats://alice:alice-pw-9c1d@")
        args = ["--packs", "none", "--durable", "--kv-key-file", str(write_kv_key(tmp_path / "kv.key"))]
        with Front(as_host, args, log_dir=tmp_path):
            with md.Nats(as_alice, timeout=5, connect_options=inbox) as t:
                assert t.call("AID.ECHO.v1", {"a": 1}).output_json == '{"a":1}'
                assert not t.call("AID.ECHO.v1", {"a": 2}, idempotency_key="k").idempotent_hit
            with md.Nats(as_alice, durable=True, timeout=5, connect_options=inbox) as t:
                assert t.call("AID.ECHO.v1", {"a": 3}).output_json == '{"a":3}'

            async def meddle() -> list[str]:
                errors: list[str] = []

                async def on_error(e: Exception) -> None:
                    errors.append(str(e))
                nc = await nats.connect(as_alice, error_cb=on_error, inbox_prefix="_INBOX.alice")
                try:
                    await nc.publish(f"$KV.machina_idempotency.{kv_key('k')}", b"junk")
                    await nc.publish("$JS.API.STREAM.PURGE.KV_machina_idempotency", b"")
                    await nc.flush()
                    await asyncio.sleep(0.5)
                finally:
                    await nc.close()
                return errors
            errors = asyncio.run(meddle())
            assert sum("permissions violation" in e.lower() for e in errors) == 2, errors
            with md.Nats(as_alice, timeout=5, connect_options=inbox) as t:
                assert t.call("AID.ECHO.v1", {"a": 2}, idempotency_key="k").idempotent_hit
