"""A hostile client of the NATS server that machina-toolhost --nats hosts use, against the
group's shared idempotency store (--nats-idempotency kv): no reply subject a client names
makes a host write into the store, and the server permissions docs/nats.md documents serve
clients while keeping them out of the store. (Forged entries and the lease gate on a replay
from the store: tests/test_nats_store.py.) Driven over NATS as any client would."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import machina_dispatch as md
import nats
import pytest
from nats_support import Front, nats_server, write_kv_key


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with nats_server() as u:
        yield u


def store_key(aid: str, idempotency_key: str) -> str:
    """The store's key for a tool's idempotency key (a plain hash: anyone can compute it)."""
    return "k" + hashlib.sha256(f"{aid}\0{idempotency_key}".encode()).hexdigest()


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


def test_no_reply_subject_makes_a_host_write_into_the_store(url: str, tmp_path: Path) -> None:
    """A client names the reply subject of its request (and the durable mode's
    Machina-Reply-To header): a host publishes its answers nowhere under `$` (JetStream's
    API, the key-value store, the system), where its own permissions would let it write."""
    bucket = "reply_idem"
    args = ["--nats-prefix", "reply", "--packs", "none", "--nats-durable", "--nats-stream", "REPLY",
            "--nats-consumer", "reply", "--nats-idempotency", "kv", "--nats-kv-bucket", bucket,
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
        args = ["--packs", "none", "--nats-durable", "--nats-idempotency", "kv",
                "--kv-key-file", str(write_kv_key(tmp_path / "kv.key"))]
        with Front(as_host, args, log_dir=tmp_path) as front:
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
                    await nc.publish(f"$KV.machina_idempotency.{store_key('AID.ECHO.v1', 'k')}", b"junk")
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
            # The host's own permissions are enough for all it does (store, stream, acks, answers):
            # a subject it may not use is a "NATS error: Not Permitted" line.
            log = front.stderr()
            assert "NATS error" not in log and "serving" in log, log
