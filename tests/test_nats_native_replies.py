"""When machina-toolhost --nats writes its replies: a reply with no other call under way goes
out at once (not after the NATS client's flusher pause, which holds every buffered write for a
millisecond), and replies to many calls in flight all come back. Driven over a raw socket in
the NATS protocol, so that the client's own latency stays out of the figure."""

from __future__ import annotations

import socket
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats_support import Front, nats_server

ECHO = b'{"aid":"AID.ECHO.v1","input_json":"{\\"n\\":1}"}'


class RawNats:
    """A NATS connection spoken by hand: CONNECT, one SUB on an inbox wildcard, PUBs."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("nats://").split(":")
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.line()  # INFO
        self.sock.sendall(b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true}\r\n'
                          b"SUB _INBOX.raw.* 1\r\nPING\r\n")
        while self.line() != b"PONG":
            pass

    def line(self) -> bytes:
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            assert chunk, "the server closed the connection"
            self.buf += chunk
        head, self.buf = self.buf.split(b"\r\n", 1)
        return head

    def payload(self, n: int) -> bytes:
        while len(self.buf) < n + 2:
            self.buf += self.sock.recv(65536)
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def send(self, subject: str, i: int, body: bytes) -> None:
        self.sock.sendall(f"PUB {subject} _INBOX.raw.{i} {len(body)}\r\n".encode() + body + b"\r\n")

    def reply(self) -> tuple[int, bytes]:
        """The next reply: the number of the request it answers, and its body."""
        while True:
            head = self.line().split()
            if head[0] == b"PING":
                self.sock.sendall(b"PONG\r\n")
            elif head[0] in (b"MSG", b"HMSG"):
                data = self.payload(int(head[-1]))
                if head[0] == b"HMSG":
                    data = data[int(head[-2]):]
                return int(head[1].rsplit(b".", 1)[1]), data


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with nats_server(jetstream=False) as u:
        yield u


def test_a_lone_reply_is_written_at_once(url: str, tmp_path: Path) -> None:
    with Front(url, ["--prefix", "nrep", "--packs", "none"], log_dir=tmp_path):
        conn = RawNats(url)
        rtts = []
        for i in range(60):
            started = time.perf_counter()
            conn.send("nrep.call", i, ECHO)
            number, body = conn.reply()
            rtts.append(time.perf_counter() - started)
            assert number == i and b'"ok":true' in body, body
        # The client's flusher pauses 1 ms before each write it makes: a reply left to it
        # takes more than that, every time.
        assert statistics.median(rtts[10:]) < 0.0009, f"median round trip {statistics.median(rtts[10:]) * 1e6:.0f} µs"


def test_replies_to_many_calls_in_flight_all_come_back(url: str, tmp_path: Path) -> None:
    with Front(url, ["--prefix", "nmany", "--packs", "none", "--concurrency", "4"], log_dir=tmp_path):
        conn = RawNats(url)
        n = 3000
        for i in range(n):
            conn.send("nmany.call", i, ECHO)
        got = {}
        for _ in range(n):
            i, body = conn.reply()
            got[i] = body
        assert sorted(got) == list(range(n))
        assert all(b'"ok":true' in b for b in got.values())
