"""The `--http` front against a web page in a local browser and a hostile peer on the network.

A browser's "simple request" (POST with `text/plain`, no preflight) and a DNS-rebinding page
(a foreign `Host`) must not reach a tool; a non-loopback address needs the bearer token;
`Transfer-Encoding` framing the parser would not honour is refused and the connection closed;
one peer cannot hold every connection (a cap per address, a deadline for the headers).
Requests are written byte by byte on raw sockets, as a browser or an attacker would send them.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import HANG_GUARD_S, TOOLHOST, base_env, scaled


class Served:
    def __init__(self, proc: subprocess.Popen[bytes], address: str, port: int) -> None:
        self.proc = proc
        self.address = address
        self.port = port


def start(tmp_path: Path, *args: str, address: str = "127.0.0.1", env: dict[str, str] | None = None) -> Served:
    bind = f"[{address}]" if ":" in address else address
    proc = subprocess.Popen([TOOLHOST, "--http", f"{bind}:0", *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=base_env({"MACHINA_TOOLHOST_WORKSPACE": str(tmp_path), **(env or {})}), cwd=tmp_path)
    assert proc.stderr is not None
    line = proc.stderr.readline().decode()
    found = re.search(r"serving HTTP on http://\S+:(\d+)", line)
    assert found, line + proc.stderr.read().decode()
    return Served(proc, address, int(found.group(1)))


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    policy = tmp_path / "policy.toml"
    policy.write_text('[shell]\nallow = ["echo"]\n')  # (what an agent's policy may well allow)
    host = start(tmp_path, "--policy", str(policy), "--http-allow-origin", "http://app.example:3000",
                 "--http-allow-host", "tools.internal")
    yield host
    host.proc.terminate()
    assert host.proc.wait(timeout=10) == 0


def raw_request(port: int, request: bytes, source: str = "127.0.0.1", timeout: float = 10) -> bytes:
    """Sends `request` as it is and returns every byte the server sends until it closes."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.bind((source, 0))
        s.connect(("127.0.0.1", port))
        s.sendall(request)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def http_request(port: int, headers: dict[str, str], body: bytes = b"", method: str = "POST", path: str = "/run",
                 source: str = "127.0.0.1") -> tuple[int, dict[str, str], Any]:
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    if body or method == "POST":
        head += f"Content-Length: {len(body)}\r\n"
    raw = raw_request(port, (head + "Connection: close\r\n\r\n").encode() + body, source)
    return parse_response(raw)


def parse_response(raw: bytes) -> tuple[int, dict[str, str], Any]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    fields = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return status, fields, json.loads(body) if body else None


SHELL = {"tool_name": "AID.SHELL.EXEC.v1", "payload": {"command": "echo", "args": ["pwned"]}}


def test_a_web_pages_simple_request_runs_nothing(served: Served) -> None:
    # What a page on http://evil.example can send without a preflight, and what a DNS-rebinding
    # page sends (its own name in Host).
    body = json.dumps(SHELL).encode()
    status, _, answer = http_request(served.port, {"Host": f"evil.example:{served.port}",
                                                   "Origin": "http://evil.example",
                                                   "Content-Type": "text/plain;charset=UTF-8"}, body)
    assert status == 403 and answer["ok"] is False
    assert answer["error"]["type"] in ("host_not_allowed", "origin_not_allowed")
    # Each check on its own.
    own = f"127.0.0.1:{served.port}"
    status, _, answer = http_request(served.port, {"Host": own, "Origin": "http://evil.example",
                                                   "Content-Type": "application/json"}, body)
    assert status == 403 and answer["error"]["type"] == "origin_not_allowed", answer
    assert "http://evil.example" in answer["error"]["message"]
    status, _, answer = http_request(served.port, {"Host": f"rebound.evil.example:{served.port}",
                                                   "Content-Type": "application/json"}, body)
    assert status == 403 and answer["error"]["type"] == "host_not_allowed", answer
    status, _, answer = http_request(served.port, {"Host": f"rebound.evil.example:{served.port}"}, method="GET",
                                     path="/tools")
    assert status == 403 and answer["error"]["type"] == "host_not_allowed"  # nothing to read either
    status, _, answer = http_request(served.port, {"Host": f"127.0.0.1:{served.port + 1}",
                                                   "Content-Type": "application/json"}, body)
    assert status == 403 and answer["error"]["type"] == "host_not_allowed"  # another port: another origin
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
        headers = {"Host": own, **({"Content-Type": content_type} if content_type else {})}
        status, _, answer = http_request(served.port, headers, body)
        assert status == 415 and answer["error"]["type"] == "unsupported_media_type", (content_type, answer)
    # The same call from a well-behaved client runs the command.
    status, _, answer = http_request(served.port, {"Host": own, "Content-Type": "application/json"}, body)
    assert status == 200 and answer["ok"], answer
    assert answer["result"]["stdout"] == "pwned\n", answer


def test_the_hosts_own_names_and_the_allowed_ones_are_served(served: Served) -> None:
    echo = json.dumps({"tool_name": "AID.ECHO.v1", "payload": {"x": 1}}).encode()
    for host in (f"127.0.0.1:{served.port}", f"localhost:{served.port}", f"LocalHost:{served.port}",
                 f"[::1]:{served.port}", "tools.internal", f"tools.internal:{served.port}"):
        status, fields, answer = http_request(served.port, {"Host": host,
                                                            "Content-Type": "application/json; charset=utf-8"}, echo)
        assert status == 200 and answer["result"] == {"x": 1}, (host, answer)
        assert "access-control-allow-origin" not in fields
    # The allowed origin: its preflight is answered, and so are its calls (readable by it).
    status, fields, _ = http_request(served.port, {"Host": f"localhost:{served.port}",
                                                   "Origin": "http://app.example:3000",
                                                   "Access-Control-Request-Method": "POST",
                                                   "Access-Control-Request-Headers": "content-type"},
                                     method="OPTIONS")
    assert status == 204 and fields["access-control-allow-origin"] == "http://app.example:3000"
    assert "POST" in fields["access-control-allow-methods"]
    assert "content-type" in fields["access-control-allow-headers"].lower()
    status, fields, answer = http_request(served.port, {"Host": f"localhost:{served.port}",
                                                        "Origin": "http://app.example:3000",
                                                        "Content-Type": "application/json"}, echo)
    assert status == 200 and answer["result"] == {"x": 1}
    assert fields["access-control-allow-origin"] == "http://app.example:3000" and fields["vary"] == "Origin"
    # A preflight for any other origin is refused.
    status, fields, answer = http_request(served.port, {"Host": f"localhost:{served.port}",
                                                        "Origin": "http://evil.example",
                                                        "Access-Control-Request-Method": "POST"}, method="OPTIONS")
    assert status == 403 and answer["error"]["type"] == "origin_not_allowed"
    assert "access-control-allow-origin" not in fields


def test_refusals_keep_the_connection_and_the_host_serving(served: Served) -> None:
    echo = json.dumps({"tool_name": "AID.ECHO.v1", "payload": 7}).encode()
    good = (f"POST /run HTTP/1.1\r\nHost: 127.0.0.1:{served.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(echo)}\r\n\r\n").encode() + echo
    bad = (f"POST /run HTTP/1.1\r\nHost: 127.0.0.1:{served.port}\r\nContent-Type: text/plain\r\n"
           f"Content-Length: {len(echo)}\r\n\r\n").encode() + echo
    last = (f"POST /run HTTP/1.1\r\nHost: 127.0.0.1:{served.port}\r\nContent-Type: application/json\r\n"
            f"Connection: close\r\nContent-Length: {len(echo)}\r\n\r\n").encode() + echo
    raw = raw_request(served.port, bad + good + last)
    statuses = [int(m) for m in re.findall(rb"HTTP/1.1 (\d{3})", raw)]
    assert statuses == [415, 200, 200], raw


def test_a_non_loopback_address_needs_the_token(tmp_path: Path) -> None:
    for address in ("0.0.0.0:0", "[::]:0", "192.0.2.1:0"):
        proc = subprocess.run([TOOLHOST, "--http", address], capture_output=True, timeout=30, env=base_env(),
                              cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert b"MACHINA_TOOLHOST_HTTP_TOKEN" in proc.stderr and b"loopback" in proc.stderr, proc.stderr
    host = start(tmp_path, address="0.0.0.0", env={"MACHINA_TOOLHOST_HTTP_TOKEN": "tok-9"})
    try:
        echo = json.dumps({"tool_name": "AID.ECHO.v1", "payload": 2}).encode()
        status, _, answer = http_request(host.port, {"Host": f"127.0.0.1:{host.port}",
                                                     "Content-Type": "application/json",
                                                     "Authorization": "Bearer tok-9"}, echo)
        assert status == 200 and answer["result"] == 2
        status, _, answer = http_request(host.port, {"Host": f"evil.example:{host.port}",
                                                     "Content-Type": "application/json",
                                                     "Authorization": "Bearer tok-9"}, echo)
        assert status == 403 and answer["error"]["type"] == "host_not_allowed"
    finally:
        host.proc.terminate()
        assert host.proc.wait(timeout=10) == 0


@pytest.mark.parametrize("framing", [
    "Transfer-Encoding: gzip\r\nContent-Length: {n}",
    "Transfer-Encoding: chunked, gzip\r\nContent-Length: {n}",
    "Transfer-Encoding: chunked, chunked",
    "Transfer-Encoding: identity",
    "Content-Length: {n}\r\nTransfer-Encoding: chunked",
    "Transfer-Encoding: chunked\r\nContent-Length: {n}",
])
def test_framing_the_parser_would_not_honour_is_refused_and_closed(served: Served, framing: str) -> None:
    echo = json.dumps({"tool_name": "AID.ECHO.v1", "payload": 3}).encode()
    chunked = f"{len(echo):x}\r\n".encode() + echo + b"\r\n0\r\n\r\n"
    body = chunked if framing.endswith("chunked") else echo
    # What a proxy that frames by the other header would take as a second request on this connection.
    smuggled = (f"GET /tools HTTP/1.1\r\nHost: 127.0.0.1:{served.port}\r\n\r\n").encode()
    head = (f"POST /run HTTP/1.1\r\nHost: 127.0.0.1:{served.port}\r\nContent-Type: application/json\r\n"
            + framing.format(n=len(body)) + "\r\n\r\n").encode()
    raw = raw_request(served.port, head + body + smuggled)
    statuses = re.findall(rb"HTTP/1.1 (\d{3})", raw)
    assert statuses == [b"400"], raw  # one answer, then the connection is closed
    status, fields, answer = parse_response(raw)
    assert answer["error"]["type"] == "malformed_request" and fields["connection"] == "close", answer
    # Chunked alone is fine.
    raw = raw_request(served.port, (f"POST /run HTTP/1.1\r\nHost: 127.0.0.1:{served.port}\r\n"
                                    "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
                                    "Connection: close\r\n\r\n").encode() + chunked)
    assert parse_response(raw)[2]["result"] == 3


def half_sent(port: int, source: str = "127.0.0.1") -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(10)
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    s.sendall(f"POST /run HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: appl".encode())
    return s


def test_one_peer_cannot_hold_every_connection(tmp_path: Path) -> None:
    host = start(tmp_path, "--http-max-connections", "40", "--http-header-timeout-ms", "2500")
    held: list[socket.socket] = []
    try:
        t0 = time.monotonic()
        held = [half_sent(host.port) for _ in range(40)]
        # Beyond the 32 a peer may hold, its connections are answered 503 and closed.
        refused = 0
        for s in held[32:]:
            raw = s.recv(65536)
            status, _, answer = parse_response(raw)
            assert status == 503 and answer["error"]["type"] == "overloaded", raw
            assert "127.0.0.1" in answer["error"]["message"]
            refused += 1
        assert refused == 8
        # Another peer is served meanwhile.
        echo = json.dumps({"tool_name": "AID.ECHO.v1", "payload": 4}).encode()
        status, _, answer = http_request(host.port, {"Host": f"127.0.0.1:{host.port}",
                                                     "Content-Type": "application/json"}, echo, source="127.0.0.2")
        assert status == 200 and answer["result"] == 4
        for s in held[:32]:  # while the 32 were still held: none has been answered yet
            s.setblocking(False)
            with pytest.raises(BlockingIOError):
                s.recv(1)
            s.setblocking(True)
        # Past the header deadline the half-sent ones are answered 408 and closed.
        for s in held[:32]:
            raw = b""
            while chunk := s.recv(65536):
                raw += chunk
            status, _, answer = parse_response(raw)
            assert status == 408 and answer["error"]["type"] == "request_timeout", raw
        assert 2.4 < time.monotonic() - t0 < scaled(HANG_GUARD_S)
    finally:
        for s in held:
            s.close()
        host.proc.terminate()
        assert host.proc.wait(timeout=10) == 0


def test_the_cap_per_peer_is_an_option(tmp_path: Path) -> None:
    host = start(tmp_path, "--http-max-connections-per-peer", "2")
    held: list[socket.socket] = []
    try:
        held = [half_sent(host.port) for _ in range(3)]
        status, _, answer = parse_response(held[2].recv(65536))
        assert status == 503 and answer["error"]["type"] == "overloaded"
        held[0].close()
        held.pop(0)
        time.sleep(0.3)  # (the host sees the close)
        echo = json.dumps({"tool_name": "AID.ECHO.v1", "payload": 5}).encode()
        status, _, answer = http_request(host.port, {"Host": f"127.0.0.1:{host.port}",
                                                     "Content-Type": "application/json"}, echo)
        assert status == 200 and answer["result"] == 5
    finally:
        for s in held:
            s.close()
        host.proc.terminate()
        assert host.proc.wait(timeout=10) == 0
    for bad in ("0", "x"):
        proc = subprocess.run([TOOLHOST, "--http", "127.0.0.1:0", "--http-max-connections-per-peer", bad],
                              capture_output=True, timeout=30, env=base_env(), cwd=tmp_path)
        assert proc.returncode == 2 and b"--http-max-connections-per-peer" in proc.stderr


def test_a_name_two_tools_share_is_refused_naming_both(tmp_path: Path) -> None:
    # The tests' skill has a tool `echo`, as the built-in plugin has: by that name neither is
    # called (the caller may mean either); the refusal names both aids.
    skill = tmp_path / "probe"  # a copy: the skill logs beside its own file
    shutil.copytree(Path(__file__).resolve().parent / "skills" / "test_skill", skill)
    host = start(tmp_path, "--tools", str(skill))
    try:
        own = f"127.0.0.1:{host.port}"
        call = json.dumps({"tool_name": "echo", "payload": {"x": 1}}).encode()
        status, _, answer = http_request(host.port, {"Host": own, "Content-Type": "application/json"}, call)
        assert status == 404 and answer["error"]["type"] == "tool_not_found", answer
        assert "AID.ECHO.v1" in answer["error"]["message"] and "AID.SKILL.PROBE.ECHO.v1" in answer["error"]["message"]
        status, _, answer = http_request(host.port, {"Host": own, "Content-Type": "application/json"},
                                         json.dumps({"tool_name": "AID.ECHO.v1", "payload": {"x": 1}}).encode())
        assert status == 200 and answer["ok"], answer  # by its aid it is found
    finally:
        host.proc.terminate()
        assert host.proc.wait(timeout=10) == 0
