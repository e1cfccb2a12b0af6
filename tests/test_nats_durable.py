"""machina-toolhost --nats --nats-durable against a real nats-server: calls taken from the
JetStream work queue, answered to their Machina-Reply-To subject and acknowledged; in
progress while they run; a '$' reply refused; SIGTERM drains and exits at once; a host killed
after its run and before its ack; the server restarted under load."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import machina_dispatch as md
import nats
import pytest
from conftest import TOOLHOST, scaled
from machina_dispatch.nats_client import Nats
from nats_support import Front, free_port, nats_server, nats_server_binary, write_kv_key
from python_support import python_tool, write_pack

# A tool that leaves a mark, then kills the host named in its input: the host dies after the
# run and before it answers or acknowledges.
FAULT_TOOLS = '''
import os
import signal


def mark_then_kill(payload):
    with open(payload["mark"], "a") as f:
        f.write("ran\\n")
    if payload.get("kill"):
        try:
            os.kill(payload["kill"], signal.SIGKILL)
        except ProcessLookupError:
            pass
    return {"marked": True}
'''


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with nats_server() as u:
        yield u


def durable_args(name: str, *more: str) -> list[str]:
    """A native host's flags for durable mode on prefix, stream and consumer of their own."""
    return ["--nats-prefix", name, "--nats-durable", "--nats-stream", name.upper(), "--nats-consumer", name, *more]


def pack(tmp_path: Path) -> Path:
    path = write_pack(tmp_path / "pack", [python_tool("AID.PY.MARK.v1", "tools.sample_tool:sleep"),
                                          python_tool("AID.PY.KILL.v1", "tools.durable_faults:mark_then_kill")])
    (tmp_path / "pack" / "tools" / "durable_faults.py").write_text(FAULT_TOOLS)
    return path


def runs(mark: Path) -> int:
    return mark.read_text().count("ran\n") if mark.exists() else 0


class Raw:
    """A nats-py client publishing durable calls itself: every answer on its inbox is kept,
    so that a second answer to one call is seen (the project's client drops it)."""

    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.subject = f"{prefix}.durable.call"
        self.answers: dict[str, list[tuple[Any, dict[str, str]]]] = {}

    async def __aenter__(self) -> Raw:
        self.nc = await nats.connect(self.url, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
        self.js = self.nc.jetstream()
        self.inbox = self.nc.new_inbox()

        async def on_answer(msg: Any) -> None:
            headers = dict(msg.headers or {})
            self.answers.setdefault(headers.get("Machina-Request-Id", ""), []).append((json.loads(msg.data), headers))
        await self.nc.subscribe(self.inbox, cb=on_answer)
        await self.nc.flush()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.nc.close()

    async def publish(self, msg_id: str, body: dict[str, Any], reply: str | None = None, retry_s: float = 0,
                      headers: dict[str, str] | None = None) -> None:
        """Publishes one call (retried with the same message id for `retry_s` while the
        server does not confirm it)."""
        headers = {"Nats-Msg-Id": msg_id, "Machina-Reply-To": self.inbox if reply is None else reply,
                   **(headers or {})}
        deadline = time.monotonic() + retry_s
        while True:
            try:
                await self.js.publish(self.subject, json.dumps(body).encode(), headers=headers, timeout=1)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)

    async def wait_answers(self, ids: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(i not in self.answers for i in ids):
            await asyncio.sleep(0.05)

    async def consumer(self, stream: str, consumer: str) -> Any:
        return await self.js.consumer_info(stream, consumer)

    async def stats(self) -> list[dict[str, Any]]:
        msg = await self.nc.request("$SRV.STATS.machina-toolhost", b"", timeout=5)
        return list(json.loads(msg.data)["endpoints"])


async def settled(raw: Raw, stream: str, consumer: str, timeout: float = 5) -> Any:
    """The consumer's state once nothing is left unacknowledged or waiting (or at the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        info = await raw.consumer(stream, consumer)
        if (info.num_ack_pending == 0 and info.num_pending == 0) or time.monotonic() > deadline:
            return info
        await asyncio.sleep(0.05)


def test_durable_calls_answered_to_the_reply_header_then_acked(url: str, tmp_path: Path) -> None:
    name = "dur1"
    with Front(url, durable_args(name), log_dir=tmp_path), \
            Nats(url, prefix=name, durable=True, timeout=10) as t:
        assert t.call("AID.ECHO.v1", {"d": 1}).output_json == '{"d":1}'
        results = t.call_many([("AID.ECHO.v1", {"i": i}) for i in range(300)])
        assert [json.loads(r.output_json) for r in results] == [{"i": i} for i in range(300)]
        with pytest.raises(md.ToolNotFound):
            t.call("AID.NOPE.v1")

        async def raw_checks() -> None:
            async with Raw(url, name) as raw:
                await raw.publish("one", {"aid": "AID.ECHO.v1", "input_json": '{"x":2}'})
                await raw.publish("bad", {"aid": "AID.NOPE.v1"})
                await raw.wait_answers(["one", "bad"], 10)
                (body, headers), = raw.answers["one"]
                assert body["ok"] and body["output_json"] == '{"x":2}' and headers["Machina-Request-Id"] == "one"
                (body, headers), = raw.answers["bad"]
                assert body["code"] == "tool_not_found" and headers["Machina-Error-Code"] == "tool_not_found"
                assert headers["Nats-Service-Error-Code"] == "404" and headers["Machina-Request-Id"] == "bad"
                # Acknowledged explicitly: nothing left in the work queue or awaiting an ack.
                info = await settled(raw, name.upper(), name)
                assert info.num_ack_pending == 0 and info.num_pending == 0 and info.num_redelivered == 0, info
                assert str(info.config.ack_policy).endswith("explicit") and info.config.durable_name == name
                assert info.config.ack_wait == 30 and info.config.max_deliver == 5, info.config
                stream = (await raw.js.stream_info(name.upper())).config
                assert stream.max_msgs == 100_000 and stream.max_bytes == 256 * 1024 * 1024, stream
                assert str(stream.discard).endswith("new") and str(stream.retention).endswith("workqueue"), stream
                assert stream.duplicate_window == 120 and stream.subjects == [f"{name}.durable.call"], stream
                durable, = [e for e in await raw.stats() if e["name"] == "durable"]
                assert durable["subject"] == f"{name}.durable.call"
                assert durable["num_requests"] == 304 and durable["num_errors"] == 2, durable
                info_msg = await raw.nc.request("$SRV.INFO.machina-toolhost", b"", timeout=5)
                durable, = [e for e in json.loads(info_msg.data)["endpoints"] if e["name"] == "durable"]
                assert durable["metadata"] == {"stream": name.upper(), "consumer": name}, durable
        asyncio.run(raw_checks())


def test_openai_calls_and_call_headers_over_the_stream(url: str, tmp_path: Path) -> None:
    """A durable message takes the forms and headers PREFIX.call takes: an OpenAI tool call
    is answered with the tool message, and its Machina-Timeout-Ms header sets its deadline."""
    name = "dur12"
    with Front(url, durable_args(name, "--tools", str(pack(tmp_path)), "--packs", "none"), log_dir=tmp_path):
        async def go() -> None:
            async with Raw(url, name) as raw:
                await raw.publish("oa", {"id": "call_1", "type": "function",
                                         "function": {"name": "AID-ECHO-v1", "arguments": '{"q":1}'}})
                slow = {"id": "call_2", "type": "function",
                        "function": {"name": "AID-PY-MARK-v1", "arguments": json.dumps({"s": 3})}}
                await raw.publish("late", slow, headers={"Machina-Timeout-Ms": "300"})
                await raw.wait_answers(["oa", "late"], 15)
                (body, headers), = raw.answers["oa"]
                assert body == {"tool_call_id": "call_1", "role": "tool", "name": "AID-ECHO-v1", "content": '{"q":1}'}
                assert headers["Machina-Request-Id"] == "oa"
                (body, headers), = raw.answers["late"]
                assert body["content"].startswith("Error: timeout"), body
                assert headers["Nats-Service-Error-Code"] == "504" and headers["Machina-Request-Id"] == "late"
        asyncio.run(go())


def test_a_call_without_a_key_runs_once_per_message_id(url: str, tmp_path: Path) -> None:
    """The message id is the call's idempotency key: the same id published again once the
    stream no longer drops it as a duplicate is answered from the host's cache, not run."""
    name = "dur2"
    marks = tmp_path / "marks"
    marks.mkdir()
    with Front(url, durable_args(name, "--tools", str(pack(tmp_path)), "--packs", "none"), log_dir=tmp_path):
        async def go() -> None:
            async with Raw(url, name) as raw:
                body = {"aid": "AID.PY.MARK.v1", "input_json": json.dumps({"s": 0, "mark": str(marks / "m")})}
                await raw.publish("same", body)
                await raw.wait_answers(["same"], 10)
                # The stream deleted (and with it its de-duplication): the host makes it and its
                # consumer again, and a publish with the same id is stored again.
                await raw.js.delete_stream(name.upper())
                await raw.publish("same", body, retry_s=10)
                deadline = time.monotonic() + 10
                while len(raw.answers["same"]) < 2 and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                first, second = raw.answers["same"]
                assert first[0]["ok"] and second[0]["ok"] and second[0].get("idempotent_hit"), second
        asyncio.run(go())
    assert runs(marks / "m") == 1


def test_a_reply_under_dollar_is_acked_and_not_run(url: str, tmp_path: Path) -> None:
    name = "dur3"
    marks = tmp_path / "marks"
    marks.mkdir()
    with Front(url, durable_args(name, "--tools", str(pack(tmp_path)), "--packs", "none"), log_dir=tmp_path) as front:
        async def go() -> None:
            async with Raw(url, name) as raw:
                body = {"aid": "AID.PY.MARK.v1", "input_json": json.dumps({"s": 0, "mark": str(marks / "dollar")})}
                await raw.publish("d1", body, reply="$JS.API.STREAM.DELETE.DUR3")
                info = await settled(raw, name.upper(), name)
                assert info.num_ack_pending == 0 and info.num_pending == 0, info
                await raw.publish("ok1", {"aid": "AID.ECHO.v1", "input_json": "{}"})
                await raw.wait_answers(["ok1"], 10)
                assert raw.answers["ok1"][0][0]["ok"] and "d1" not in raw.answers
                assert (await raw.js.stream_info(name.upper())).config.name == name.upper()  # not deleted
        asyncio.run(go())
        assert "not answered: the reply subject '$JS.API.STREAM.DELETE.DUR3' lies under '$'" in front.stderr()
    assert runs(marks / "dollar") == 0


@pytest.mark.parametrize(("tag", "reply"), [("space", "a b"), ("star", "x.*"), ("gt", "y.>"), ("empty", "z..q"),
                                          ("tab", "tab\there")])
def test_a_reply_that_is_no_subject_is_acked_and_not_run(url: str, tmp_path: Path, tag: str, reply: str) -> None:
    name = f"dur11{tag}"  # a stream of its own: the message ids are the same in each
    marks = tmp_path / "marks"
    marks.mkdir()
    with Front(url, durable_args(name, "--tools", str(pack(tmp_path)), "--packs", "none"), log_dir=tmp_path) as front:
        async def go() -> None:
            async with Raw(url, name) as raw:
                body = {"aid": "AID.PY.MARK.v1", "input_json": json.dumps({"s": 0, "mark": str(marks / "bad")})}
                await raw.publish("bad", body, reply=reply)
                await raw.publish("good", {"aid": "AID.ECHO.v1", "input_json": "{}"})
                await raw.wait_answers(["good"], 10)
                info = await settled(raw, name.upper(), name)
                assert info.num_ack_pending == 0 and info.num_pending == 0, info
                assert raw.answers["good"][0][0]["ok"] and "bad" not in raw.answers
        asyncio.run(go())
        assert "not answered: the reply subject" in front.stderr() and "is not a subject" in front.stderr()
    assert runs(marks / "bad") == 0


def test_a_call_longer_than_the_ack_wait_is_kept_in_progress(url: str, tmp_path: Path) -> None:
    """Ack wait 2 s, a call of 5 s: the host says it is still working, so the server does
    not deliver the call again (one run, one answer, no redelivery)."""
    name = "dur4"
    marks = tmp_path / "marks"
    marks.mkdir()
    with Front(url, durable_args(name, "--tools", str(pack(tmp_path)), "--packs", "none", "--nats-ack-wait-s", "2"),
               log_dir=tmp_path):
        async def go() -> None:
            async with Raw(url, name) as raw:
                body = {"aid": "AID.PY.MARK.v1", "input_json": json.dumps({"s": 5, "mark": str(marks / "slow")}),
                        "timeout_ms": 15_000}
                await raw.publish("slow", body)
                await raw.wait_answers(["slow"], 20)
                await asyncio.sleep(2.5)  # a redelivery would have come by now
                assert len(raw.answers["slow"]) == 1 and raw.answers["slow"][0][0]["ok"], raw.answers
                info = await settled(raw, name.upper(), name)
                assert info.num_redelivered == 0 and info.num_ack_pending == 0, info
        asyncio.run(go())
    assert runs(marks / "slow") == 1


def test_a_call_delivered_again_after_its_answer_is_not_answered_twice(tmp_path: Path) -> None:
    """The host's acks never reach the server (its user may not publish to $JS.ACK.>), so the
    server delivers an answered call again, to the same host, until --nats-max-deliver: it
    is answered once and run once."""
    name = "dur9"
    marks = tmp_path / "marks"
    marks.mkdir()
    config = """
authorization {
  users = [
    { user: all, password: all }
    { user: noack, password: noack, permissions: { publish: { deny: ["$JS.ACK.>"] } } }
  ]
}
"""
    with nats_server(config=config) as url:
        args = durable_args(name, "--tools", str(pack(tmp_path)), "--packs", "none", "--nats-ack-wait-s", "0.5",
                            "--nats-max-deliver", "4")
        with Front(url.replace("nats://", "nats://noack:noack@"), args, log_dir=tmp_path):
            async def go() -> None:
                async with Raw(url.replace("nats://", "nats://all:all@"), name) as raw:
                    body = {"aid": "AID.PY.MARK.v1", "input_json": json.dumps({"s": 0, "mark": str(marks / "m")})}
                    await raw.publish("again", body)
                    deadline = time.monotonic() + 10
                    while time.monotonic() < deadline:
                        info = await raw.consumer(name.upper(), name)
                        if info.num_redelivered > 0 and info.delivered.consumer_seq >= 4:
                            break
                        await asyncio.sleep(0.05)
                    assert info.delivered.consumer_seq >= 4, info  # delivered four times
                    await asyncio.sleep(0.3)
                    assert len(raw.answers["again"]) == 1 and raw.answers["again"][0][0]["ok"], raw.answers
            asyncio.run(go())
    assert runs(marks / "m") == 1


def test_a_busy_host_fetches_nothing_and_an_idle_one_serves(url: str, tmp_path: Path) -> None:
    """A host whose workers are all busy (with calls on PREFIX.call) fetches no durable call:
    the calls stay in the stream, and a second, idle host serves them meanwhile."""
    name = "dur10"
    marks = tmp_path / "marks"
    marks.mkdir()
    args = durable_args(name, "--tools", str(pack(tmp_path)), "--packs", "none", "--workers", "2",
                        "--python-workers", "2")
    busy = Front(url, args, log_dir=tmp_path)
    try:
        async def go() -> None:
            async with Raw(url, name) as raw:
                slow = {"aid": "AID.PY.MARK.v1", "timeout_ms": 20_000,
                        "input_json": json.dumps({"s": 4, "started": str(marks / "started")})}
                held = [asyncio.ensure_future(raw.nc.request(f"{name}.call", json.dumps(slow).encode(), timeout=30))
                        for _ in range(2)]
                deadline = time.monotonic() + 10
                while not (marks / "started").exists() and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                await asyncio.sleep(0.8)  # (both workers in the tool, and a fetch made while idle expired)
                for i in range(2):
                    await raw.publish(f"q{i}", {"aid": "AID.ECHO.v1", "input_json": "{}"})
                await asyncio.sleep(0.5)
                info = await raw.consumer(name.upper(), name)
                assert info.num_ack_pending == 0 and info.num_pending == 2, info  # not taken by the busy host
                idle = await asyncio.to_thread(Front, url, args, None, tmp_path)
                try:
                    await raw.wait_answers(["q0", "q1"], 10)
                    assert all(raw.answers[i][0][0]["ok"] for i in ("q0", "q1")), raw.answers
                    assert not any(h.done() for h in held)  # served while the first host was busy
                finally:
                    assert idle.stop() == 0, idle.stderr()
                await asyncio.gather(*held)
        asyncio.run(go())
    finally:
        assert busy.stop() == 0, busy.stderr()


def test_sigterm_drains_and_exits_within_two_seconds(url: str, tmp_path: Path) -> None:
    name = "dur5"
    marks = tmp_path / "marks"
    marks.mkdir()
    idle = Front(url, durable_args(name), log_dir=tmp_path)
    start = time.monotonic()
    idle.proc.send_signal(signal.SIGTERM)
    assert idle.proc.wait(10) == 0, idle.stderr()
    assert time.monotonic() - start <= scaled(2.0)
    # A call taken before the signal is answered and acknowledged, and then the host exits.
    busy = Front(url, durable_args(name, "--tools", str(pack(tmp_path)), "--packs", "none"), log_dir=tmp_path)

    async def go() -> None:
        async with Raw(url, name) as raw:
            body = {"aid": "AID.PY.MARK.v1",
                    "input_json": json.dumps({"s": 1, "mark": str(marks / "m"), "started": str(marks / "started")})}
            await raw.publish("taken", body)
            deadline = time.monotonic() + 10
            while not (marks / "started").exists() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            signalled = time.monotonic()
            busy.proc.send_signal(signal.SIGTERM)
            await raw.wait_answers(["taken"], 10)
            while busy.proc.poll() is None and time.monotonic() < signalled + 10:
                await asyncio.sleep(0.02)
            assert busy.proc.returncode == 0, busy.stderr()
            assert time.monotonic() - signalled <= scaled(1 + 2.0)
            assert raw.answers["taken"][0][0]["ok"]
            info = await settled(raw, name.upper(), name)
            assert info.num_ack_pending == 0 and info.num_pending == 0, info
    asyncio.run(go())
    assert runs(marks / "m") == 1


def test_host_killed_after_its_run_before_its_ack(tmp_path: Path) -> None:
    """The first host runs the tool and stores its answer in the shared store, but the server
    lets it neither answer nor acknowledge (its user may not publish to _INBOX.> or
    $JS.ACK.>); it is then killed (SIGKILL). After the ack wait the stream delivers the call
    to a second host, which replays the stored answer: one answer, one run."""
    name = "dur6"
    marks = tmp_path / "marks"
    marks.mkdir()
    key = write_kv_key(tmp_path / "kv.key")
    config = """
authorization {
  users = [
    { user: all, password: all }
    { user: mute, password: mute, permissions: { publish: { deny: ["_INBOX.>", "$JS.ACK.>"] } } }
  ]
}
"""
    with nats_server(config=config) as url:
        def host_url(user: str) -> str:
            return url.replace("nats://", f"nats://{user}:{user}@")
        args = durable_args(name, "--tools", str(pack(tmp_path)), "--packs", "none", "--nats-ack-wait-s", "1",
                            "--nats-max-deliver", "20", "--nats-idempotency", "kv", "--kv-key-file", str(key))
        mute = Front(host_url("mute"), args, log_dir=tmp_path)

        async def go() -> None:
            async with Raw(host_url("all"), name) as raw:
                body = {"aid": "AID.PY.MARK.v1", "input_json": json.dumps({"s": 0, "mark": str(marks / "m")})}
                await raw.publish("stored", body)
                deadline = time.monotonic() + 10
                while runs(marks / "m") == 0 and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                await asyncio.sleep(0.3)  # (its answer stored, its answer and ack refused by the server)
                mute.kill()
                assert "stored" not in raw.answers and runs(marks / "m") == 1
                second = await asyncio.to_thread(Front, host_url("all"), args, None, tmp_path)
                try:
                    await raw.wait_answers(["stored"], 15)
                    await asyncio.sleep(1.5)  # (a second answer would have come by now)
                finally:
                    assert second.stop() == 0, second.stderr()
                (body, _), = raw.answers["stored"]
                assert body["ok"] and body.get("idempotent_hit"), body
        asyncio.run(go())
    assert runs(marks / "m") == 1


def test_host_killed_inside_its_run(url: str, tmp_path: Path) -> None:
    """The first host dies (SIGKILL, sent by the tool it runs) after the tool did its work and
    before any answer was stored: the second host that gets the call again does not run it;
    once the dead host's claim has lapsed it answers that the outcome is unknown."""
    name = "dur8"
    marks = tmp_path / "marks"
    marks.mkdir()
    key = write_kv_key(tmp_path / "kv.key")
    args = durable_args(name, "--tools", str(pack(tmp_path)), "--packs", "none", "--nats-ack-wait-s", "1",
                        "--nats-idempotency", "kv", "--kv-key-file", str(key), "--nats-kv-bucket", "dur8_idem",
                        "--nats-claim-grace-ms", "500")
    dying = Front(url, args, log_dir=tmp_path)

    async def go() -> None:
        async with Raw(url, name) as raw:
            body = {"aid": "AID.PY.KILL.v1", "timeout_ms": 2000,
                    "input_json": json.dumps({"mark": str(marks / "k"), "kill": dying.proc.pid})}
            await raw.publish("killed", body)
            deadline = time.monotonic() + 10
            while dying.proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert dying.proc.returncode == -signal.SIGKILL and runs(marks / "k") == 1
            second = await asyncio.to_thread(Front, url, args, None, tmp_path)
            try:
                await raw.wait_answers(["killed"], 15)
                await asyncio.sleep(1.5)  # (a second answer would have come by now)
            finally:
                assert second.stop() == 0, second.stderr()
            (body, _), = raw.answers["killed"]
            assert body["code"] == "tool_crashed" and "unknown" in body["error"], body
    asyncio.run(go())
    assert runs(marks / "k") == 1


@contextlib.contextmanager
def restartable_server() -> Iterator[tuple[str, Any]]:
    """A nats-server with JetStream in a folder of its own, and a function that restarts it
    on the same port and folder."""
    with tempfile.TemporaryDirectory(prefix="machina-nats-") as store:
        port = free_port()
        argv = [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", store]
        procs = [subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]

        def wait_up() -> None:
            import socket
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    return
                time.sleep(0.05)
            raise RuntimeError("nats-server did not start")

        def restart() -> None:
            procs[0].terminate()
            procs[0].wait(10)
            procs[0] = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_up()

        wait_up()
        try:
            yield f"nats://127.0.0.1:{port}", restart
        finally:
            procs[0].terminate()
            procs[0].wait(10)


def test_server_restart_under_load(tmp_path: Path) -> None:
    """The server restarts while durable calls are running: the host reconnects and serves
    again, no call is answered twice and none runs twice; every call published once the
    server is back is answered."""
    name = "dur7"
    marks = tmp_path / "marks"
    marks.mkdir()
    with restartable_server() as (url, restart):
        front = Front(url, durable_args(name, "--tools", str(pack(tmp_path)), "--packs", "none", "--workers", "8",
                                        "--python-workers", "8", "--nats-ack-wait-s", "1"),
                      log_dir=tmp_path)
        try:
            async def go() -> None:
                async with Raw(url, name) as raw:
                    def body(i: int, s: float) -> dict[str, Any]:
                        payload = {"s": s, "mark": str(marks / f"c{i}")}
                        return {"aid": "AID.PY.MARK.v1", "input_json": json.dumps(payload)}
                    before = [f"b{i}" for i in range(40)]  # 2.5 s of work for 8 workers
                    for i, msg_id in enumerate(before):
                        await raw.publish(msg_id, body(i, 0.5))
                    deadline = time.monotonic() + 10
                    while not raw.answers and time.monotonic() < deadline:  # (its Python workers started)
                        await asyncio.sleep(0.02)
                    under_way = len(raw.answers)
                    await asyncio.to_thread(restart)
                    after = [f"a{i}" for i in range(150)]
                    for i, msg_id in enumerate(after):
                        await raw.publish(msg_id, body(1000 + i, 0.02), retry_s=15)
                    await raw.wait_answers(after, 30)
                    await asyncio.sleep(2.5)  # (a second answer after a redelivery would have come by now)
                    twice = {k: len(v) for k, v in raw.answers.items() if len(v) > 1}
                    assert not twice, f"answered more than once: {twice}"
                    missing = [i for i in after if i not in raw.answers]
                    assert not missing, f"not answered after the restart: {missing[:10]} ({len(missing)})"
                    assert all(a[0][0]["ok"] for a in raw.answers.values()), raw.answers
                    assert 0 < under_way < len(before), "the restart came with no call under way"
            asyncio.run(go())
            for i in [*range(40), *range(1000, 1150)]:
                assert runs(marks / f"c{i}") <= 1, f"c{i} ran twice"
            assert front.proc.poll() is None, front.stderr()
        finally:
            assert front.stop() == 0, front.stderr()


@pytest.mark.parametrize(("flags", "said"), [
    (["--nats-stream", "a.b"], "--nats-stream a.b: expected one token"),
    (["--nats-consumer", "x y"], "--nats-consumer x y: expected one token"),
    (["--nats-ack-wait-s", "0"], "--nats-ack-wait-s: Value 0 not in range 0.1"),
    (["--nats-ack-wait-s", "86401"], "--nats-ack-wait-s: Value 86401 not in range"),
    (["--nats-max-deliver", "0"], "--nats-max-deliver: Value 0 not in range 1 to 1000000"),
    ([], "has no JetStream (nats-server -js)"),
])
def test_durable_settings_refused_with_a_reason(flags: list[str], said: str) -> None:
    with nats_server(jetstream=False) as url:
        r = subprocess.run([TOOLHOST, "--nats", url, "--nats-durable", *flags], capture_output=True, text=True,
                           timeout=30)
    assert r.returncode == 2 and said in r.stderr, r.stderr
