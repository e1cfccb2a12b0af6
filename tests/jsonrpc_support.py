"""Helpers for the JSON-RPC tests (skills, MCP servers, the --mcp and --skill fronts): the
tests' skill and MCP servers copied into a test's folder, manifests naming them, and a line
client that talks to a JSON-RPC process the way a real client does (requests matched by id,
notifications kept, many requests in flight); and one session of the official MCP SDK's client."""

from __future__ import annotations

import itertools
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
from conftest import TOOLHOST, base_env
from python_support import toml_value

HERE = Path(__file__).resolve().parent
PROBE_SKILL = HERE / "skills" / "test_skill"
MCP_SERVERS = HERE / "mcp_servers"
PYTHON = sys.executable


def probe_skill(tmp_path: Path) -> Path:
    """A private copy of the tests' skill (it logs to probe.log beside itself)."""
    target = tmp_path / "probe"
    shutil.copytree(PROBE_SKILL, target)
    return target


def probe_log(skill_dir: Path) -> list[dict[str, Any]]:
    path = skill_dir / "probe.log"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def wait_for(predicate: Any, timeout: float = 10.0, what: str = "the condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def manifest(tmp_path: Path, tables: Sequence[tuple[str, Mapping[str, Any]]], name: str = "tools.toml") -> Path:
    """A tool manifest of the given tables ([[skill]], [[mcp_server]], [[tool]])."""
    lines: list[str] = []
    for table, fields in tables:
        lines.append(f"[[{table}]]")
        lines.extend(f"{k} = {toml_value(v)}" for k, v in fields.items())
        lines.append("")
    path = tmp_path / name
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def skill_env(tmp_path: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a host under test: skills' data directories in the test's folder."""
    return base_env({"XDG_STATE_HOME": str(tmp_path / "state"), **(extra or {})})


def sdk_session(server: Any, mode: str) -> dict[str, Any]:
    """One session of the official MCP SDK's client with `server` (a URL, or stdio parameters) in
    `mode`: its protocol version, the tools listed, AID.ECHO.v1 called, AID.TEXT.STATS.v1 called
    with an input its schema refuses, and the error of a call of a tool that does not exist."""
    from mcp import Client
    from mcp.shared.exceptions import MCPError

    async def session() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with Client(server, mode=mode, read_timeout_seconds=60) as client:
            out["version"] = client.protocol_version
            out["list"] = await client.list_tools()
            out["echo"] = await client.call_tool("AID.ECHO.v1", {"a": [1, "é"]})
            out["invalid"] = await client.call_tool("AID.TEXT.STATS.v1", {"text": 5})
            try:
                await client.call_tool("AID.NOPE.v1", {})
            except MCPError as e:
                out["unknown"] = e
        return out
    return anyio.run(session)


def mcp_server_command(name: str = "sdk_server.py") -> list[str]:
    return [PYTHON, str(MCP_SERVERS / name)]


class LineClient:
    """A JSON-RPC 2.0 client on a process's stdin and stdout, one message a line."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: Path | None = None) -> None:
        self.proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=dict(env) if env is not None else base_env(), cwd=cwd)
        self.ids = itertools.count(1)
        self.answers: dict[Any, dict[str, Any]] = {}
        self.notifications: list[dict[str, Any]] = []
        self.lines: queue.Queue[bytes | None] = queue.Queue()
        self.cv = threading.Condition()
        self.stderr = b""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._err = threading.Thread(target=self._read_stderr, daemon=True)
        self._err.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.put(raw)
            message = json.loads(raw)
            with self.cv:
                if "id" in message and "method" not in message:
                    self.answers[json.dumps(message["id"])] = message
                else:
                    self.notifications.append(message)
                self.cv.notify_all()
        self.lines.put(None)
        with self.cv:
            self.cv.notify_all()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        self.stderr = self.proc.stderr.read()

    def send_raw(self, line: bytes | str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() if isinstance(line, str) else line)
        if not (line.endswith(b"\n") if isinstance(line, bytes) else line.endswith("\n")):
            self.proc.stdin.write(b"\n")
        self.proc.stdin.flush()

    def send(self, method: str, params: Any = None, id: Any = None, notify: bool = False) -> Any:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if not notify:
            message["id"] = next(self.ids) if id is None else id
        if params is not None:
            message["params"] = params
        self.send_raw(json.dumps(message))
        return message.get("id")

    def answer(self, id: Any, timeout: float = 30.0) -> dict[str, Any]:
        key = json.dumps(id)
        with self.cv:
            if not self.cv.wait_for(lambda: key in self.answers or self.proc.poll() is not None, timeout):
                raise AssertionError(f"no answer to {id} within {timeout} s")
            if key not in self.answers:
                self.cv.wait_for(lambda: key in self.answers, 1.0)
            assert key in self.answers, f"the process ended without answering {id}: {self.stderr[-2000:]!r}"
            return self.answers.pop(key)

    def has_answer(self, id: Any) -> bool:
        with self.cv:
            return json.dumps(id) in self.answers

    def request(self, method: str, params: Any = None, timeout: float = 30.0) -> dict[str, Any]:
        return self.answer(self.send(method, params), timeout)

    def result(self, method: str, params: Any = None, timeout: float = 30.0) -> Any:
        answer = self.request(method, params, timeout)
        assert "result" in answer, answer
        return answer["result"]

    def close(self, timeout: float = 30.0) -> int:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        rc = self.proc.wait(timeout)
        self._reader.join(5)
        self._err.join(5)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.close()

    def __enter__(self) -> LineClient:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            try:
                self.close(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def toolhost_argv(*args: str | os.PathLike[str]) -> list[str]:
    return [TOOLHOST, *(os.fspath(a) for a in args)]
