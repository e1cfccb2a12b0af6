"""Hosting an MCP server reached over Streamable HTTP ([[mcp_server]] with a `url`): the
official SDK's own server on a free localhost port, answering with event streams or with
JSON bodies; its tools registered and called through the host, a call past its deadline
answered `timeout`; the bearer token taken from the environment; a session the server
forgot opened again; a server that refuses the token, or is not there, named at load; and
headers or tokens that could go where they should not refused.
"""
from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import machina_dispatch as md
import pytest
from conftest import TOOLHOST, base_env
from jsonrpc_support import MCP_SERVERS, manifest

P = "AID.MCP.REMOTE."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RemoteServer:
    def __init__(self, *args: str) -> None:
        self.port = free_port()
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(MCP_SERVERS / "sdk_server.py"), "--http", str(self.port),
                                      *self.args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        give_up = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                assert self.proc.poll() is None, self.proc.stderr.read().decode() if self.proc.stderr else ""
                assert time.monotonic() < give_up, "the SDK's server did not listen within 30 s"
                time.sleep(0.05)

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.terminate()
        self.proc.wait(timeout=10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"


@pytest.fixture(params=["event streams", "JSON bodies"])
def remote(request: pytest.FixtureRequest) -> Iterator[RemoteServer]:
    server = RemoteServer(*(["--json"] if request.param == "JSON bodies" else []), "--token", "t0ken")
    yield server
    server.stop()


def remote_manifest(tmp_path: Path, server: RemoteServer) -> Path:
    return manifest(tmp_path, [("mcp_server", {"name": "remote", "url": server.url, "token_env": "REMOTE_TOKEN"})])


def test_its_tools_are_listed_and_called(remote: RemoteServer, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REMOTE_TOKEN", "t0ken")
    with md.InProcess(tools=[str(remote_manifest(tmp_path, remote))]) as host:
        aids = {t["aid"] for t in host.host.list_tools()}
        assert {P + "ADD.v1", P + "REVERSE.v1", P + "FAIL.v1"} <= aids
        r = host.call(P + "ADD.v1", {"a": 2, "b": 40})
        assert r.output == {"sum": 42, "inputs": [2, 40]}
        assert r.trace["runner"] == "mcp" and r.trace["url"] == remote.url
        assert host.call(P + "REVERSE.v1", {"text": "abc"}).output == {"result": "cba"}
        failed = host.call(P + "FAIL.v1", {"message": "no"}, check=False)
        assert (failed.status, failed.code) == ("TOOL_ERROR", "tool_error")
        assert host.call(P + "ADD.v1", {"a": "two", "b": 1}, check=False).code == "schema_violation"
        slow = host.call(P + "SLOW.v1", {"seconds": 5}, timeout=0.3, check=False)
        assert slow.code == "timeout" and "notifications/cancelled" in slow.error
        assert host.call(P + "ADD.v1", {"a": 3, "b": 4}).output["sum"] == 7  # (the session serves on)


def test_a_session_the_server_forgot_is_opened_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REMOTE_TOKEN", "t0ken")
    server = RemoteServer("--token", "t0ken")
    try:
        with md.InProcess(tools=[str(remote_manifest(tmp_path, server))]) as host:
            assert host.call(P + "ADD.v1", {"a": 1, "b": 1}).output["sum"] == 2
            server.stop()
            server.start()  # (a new process: it knows no session)
            assert host.call(P + "ADD.v1", {"a": 2, "b": 2}).output["sum"] == 4
    finally:
        server.stop()


def test_a_refused_token_or_no_server_is_named_at_load(remote: RemoteServer, tmp_path: Path) -> None:
    m = remote_manifest(tmp_path, remote)
    env = base_env({"REMOTE_TOKEN": "wrong"})
    proc = subprocess.run([TOOLHOST, "--tools", str(m), "--list"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2
    assert "mcp_server remote" in proc.stderr and "HTTP 401" in proc.stderr, proc.stderr
    proc = subprocess.run([TOOLHOST, "--tools", str(m), "--list"], capture_output=True, text=True,
                          env=base_env({}), timeout=60)
    assert proc.returncode == 2 and "REMOTE_TOKEN is not set" in proc.stderr, proc.stderr
    gone = manifest(tmp_path, [("mcp_server", {"name": "gone", "url": f"http://127.0.0.1:{free_port()}/mcp"})],
                    name="gone.toml")
    proc = subprocess.run([TOOLHOST, "--tools", str(gone), "--list"], capture_output=True, text=True,
                          env=base_env({}), timeout=60)
    assert proc.returncode == 2 and "mcp_server gone" in proc.stderr and "initialize failed" in proc.stderr, \
        proc.stderr


def test_a_manifest_gives_a_command_or_a_url(tmp_path: Path) -> None:
    both = manifest(tmp_path, [("mcp_server", {"name": "x", "url": "http://127.0.0.1:1/mcp", "command": ["x"]})])
    proc = subprocess.run([TOOLHOST, "--tools", str(both), "--list"], capture_output=True, text=True,
                          env=base_env({}), timeout=60)
    assert proc.returncode == 2 and "give command (a server started here) or url, not both" in proc.stderr
    bad = manifest(tmp_path, [("mcp_server", {"name": "x", "url": "http://127.0.0.1:1/mcp",
                                              "headers": {"X-Bad": "a\nb"}})], name="bad.toml")
    proc = subprocess.run([TOOLHOST, "--tools", str(bad), "--list"], capture_output=True, text=True,
                          env=base_env({}), timeout=60)
    assert proc.returncode == 2 and "must be one line" in proc.stderr


def test_headers_and_tokens_that_could_reach_the_wrong_place_are_refused(tmp_path: Path) -> None:
    def load(table: dict[str, object], env: dict[str, str], name: str) -> str:
        m = manifest(tmp_path, [("mcp_server", {"name": "x", **table})], name=name)
        proc = subprocess.run([TOOLHOST, "--tools", str(m), "--list"], capture_output=True, text=True,
                              env=base_env(env), timeout=60)
        assert proc.returncode == 2
        return proc.stderr
    local = "http://127.0.0.1:1/mcp"
    assert "holds control characters" in load({"url": local, "token_env": "T"}, {"T": "a\r\nX-Evil: 1"}, "nl.toml")
    assert "sent only over https://" in load({"url": "http://tools.example/mcp", "token_env": "T"}, {"T": "t"},
                                             "plain.toml")
    # A name that looks like a loopback address is a name: it may resolve anywhere.
    assert "sent only over https://" in load({"url": "http://127.0.0.1.example/mcp", "token_env": "T"},
                                             {"T": "t"}, "lookalike.toml")
    assert "is set by the host itself" in load({"url": local, "headers": {"Mcp-Session-Id": "s"}}, {}, "own.toml")
    assert "give one of them" in load({"url": local, "token_env": "T", "headers": {"Authorization": "x"}},
                                      {"T": "t"}, "both.toml")
