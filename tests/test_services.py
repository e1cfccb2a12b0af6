"""HTTP tool services (tool protocol v1 over HTTP), both sides. The service runner POSTs the
protocol's service request to a manifest tool's URL over kept-alive connections, after a
capability handshake that is cached and that refuses a service not covering the tool's
guarantees (coverage_missing) unless the operator overrides it; every failure of the service
has its own code. `machina-toolhost --http` is such a service: it answers run requests for any
of its tools and the handshake with the guarantees it really enforces. The runner is tested
against our own server and against a small independent service written here with the standard
library only."""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import machina_dispatch as md
import pytest
from conftest import TOOLHOST, base_env, serve
from python_support import call, python_tool, write_pack


def service_tool(aid: str, url: str, **fields: Any) -> dict[str, Any]:
    return {"aid": aid, "runner": "service", "url": url, **fields}


# --- a small independent service (the standard library only) -----------------------------


class Recorder:
    """What the independent service saw and how it behaves."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any], dict[str, str]]] = []
        self.connections = 0
        self.enforcement = "enforced"
        self.supported: dict[str, bool] = {"no_network": True}
        self.lock = threading.Lock()


def make_handler(rec: Recorder) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive

        def setup(self) -> None:
            super().setup()
            with rec.lock:
                rec.connections += 1

        def log_message(self, *args: Any) -> None:
            pass

        def reply(self, status: int, body: bytes, content_length: int | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body) if content_length is None else content_length))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with rec.lock:
                rec.requests.append((self.path, body, dict(self.headers)))
            if self.path == "/capabilities/handshake":
                self.reply(200, json.dumps({"ok": True, "enforcement": rec.enforcement,
                                            "supported_guarantees": rec.supported,
                                            "service_version": "stdlib-1"}).encode())
                return
            payload = body["payload"]
            how = payload.get("how", "ok")
            if how == "ok":
                self.reply(200, json.dumps({"ok": True, "result": {"sum": payload["a"] + payload["b"]}}).encode())
            elif how == "error":
                self.reply(200, json.dumps({"ok": False, "error": {"type": "ValueError", "message": "bad numbers",
                                                                   "reason_code": "guarantee_blocked"}}).encode())
            elif how == "http500":
                self.reply(500, b"internal trouble")
            elif how == "not_json":
                self.reply(200, b"<html>hello</html>")
            elif how == "huge":
                self.reply(200, b'{"ok": true, "result": "' + b"x" * (3 * 1024 * 1024) + b'"}')
            elif how == "slow":
                time.sleep(payload["s"])
                self.reply(200, b'{"ok": true, "result": "late"}')
            elif how == "no_ok":
                self.reply(200, b'{"result": 1}')

    return Handler


@pytest.fixture
def stdlib_service() -> Iterator[tuple[str, Recorder]]:
    rec = Recorder()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(rec))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", rec
    server.shutdown()
    server.server_close()


def run_requests(tmp_path: Path, tools: list[dict[str, Any]], requests: list[dict[str, Any]], *args: str,
                 env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    manifest = write_pack(tmp_path / "pack", tools)
    return serve(requests, "--tools", str(manifest), *args, env=env)


def test_a_service_tool_sends_the_protocols_request_over_one_kept_alive_connection(
        tmp_path: Path, stdlib_service: tuple[str, Recorder]) -> None:
    base, rec = stdlib_service
    tools = [service_tool("AID.SVC.SUM.v1", f"{base}/run", name="summer", entry="tools.sums:add",
                          guarantees={"no_network": True})]
    r = run_requests(tmp_path, tools, [call("AID.SVC.SUM.v1", {"a": 1, "b": i}, trace_id=f"t{i}") for i in range(5)])
    assert [json.loads(x["output_json"]) for x in r] == [{"sum": 1 + i} for i in range(5)]
    runs = [(path, body) for path, body, _ in rec.requests if path == "/run"]
    assert len(runs) == 5
    path, body = runs[0]
    assert body == {"protocol_version": 1, "tool_name": "summer", "kind": "python", "entry": "tools.sums:add",
                    "payload": {"a": 1, "b": 0}, "timeout_ms": 30000, "trace_id": "t0",
                    "project": {"app_root": str(tmp_path / "pack"), "flow": ""}}
    handshakes = [body for path, body, _ in rec.requests if path == "/capabilities/handshake"]
    assert handshakes == [{"protocol_version": 1, "tool_name": "summer", "runner": "service",
                           "required_guarantees": {"no_network": True}}]  # once: cached
    assert rec.connections == 1  # keep-alive
    trace = r[0]["trace"]
    assert (trace["runner"], trace["service_url"], trace["service_handshake"]) == ("service", f"{base}/run", "ok")
    assert (trace["enforcement_level"], trace["service_version"], trace["trace_id"]) == ("enforced", "stdlib-1", "t0")
    assert trace["http_status"] == 200 and trace["duration_ms"] > 0


def test_a_tool_requiring_no_guarantee_is_called_without_a_handshake(
        tmp_path: Path, stdlib_service: tuple[str, Recorder]) -> None:
    base, rec = stdlib_service
    tools = [service_tool("AID.SVC.SUM.v1", f"{base}/run", name="summer", entry="tools.sums:add")]
    [r] = run_requests(tmp_path, tools, [call("AID.SVC.SUM.v1", {"a": 1, "b": 2})])
    assert json.loads(r["output_json"]) == {"sum": 3}
    assert [path for path, _, _ in rec.requests] == ["/run"]
    assert (r["trace"]["service_handshake"], r["trace"]["enforcement_level"]) == ("not_required", "none")


def test_each_failure_of_a_service_has_its_own_code(tmp_path: Path, stdlib_service: tuple[str, Recorder]) -> None:
    base, _ = stdlib_service
    tools = [service_tool("AID.SVC.SUM.v1", f"{base}/run"),
             service_tool("AID.SVC.DOWN.v1", "http://127.0.0.1:9/run")]  # nothing listens on port 9
    r = run_requests(tmp_path, tools, [
        call("AID.SVC.SUM.v1", {"how": "error"}),
        call("AID.SVC.SUM.v1", {"how": "http500"}),
        call("AID.SVC.SUM.v1", {"how": "not_json"}),
        call("AID.SVC.SUM.v1", {"how": "no_ok"}),
        call("AID.SVC.SUM.v1", {"how": "huge"}),
        call("AID.SVC.DOWN.v1", {}),
        call("AID.SVC.SUM.v1", {"how": "slow", "s": 2}, timeout_ms=400),
        call("AID.SVC.SUM.v1", {"how": "ok", "a": 2, "b": 3}),
    ], "--breaker-threshold", "100")
    assert (r[0]["code"], r[0]["error"]) == ("tool_error", "ValueError: bad numbers")
    assert r[0]["trace"]["reason_code"] == "guarantee_blocked"
    assert r[1]["code"] == "service_http_error" and "HTTP 500" in r[1]["error"] and "internal trouble" in r[1]["error"]
    assert r[2]["code"] == "service_bad_response" and "<html>" in r[2]["error"]
    assert r[3]["code"] == "service_bad_response" and "'ok'" in r[3]["error"]
    assert r[4]["code"] == "output_too_large"
    assert r[5]["code"] == "service_unavailable" and "Connection refused" in r[5]["error"]
    assert r[6]["code"] == "timeout"
    assert r[7]["ok"] and json.loads(r[7]["output_json"]) == {"sum": 5}  # the host kept serving
    assert all(x["status"] == "TOOL_ERROR" for x in r[:7])


def test_a_service_that_does_not_cover_the_guarantees_is_refused_unless_overridden(
        tmp_path: Path, stdlib_service: tuple[str, Recorder]) -> None:
    base, rec = stdlib_service
    rec.supported = {"no_network": True}
    tools = [service_tool("AID.SVC.A.v1", f"{base}/run", guarantees={"no_network": True, "no_subprocess": True}),
             service_tool("AID.SVC.B.v1", f"{base}/run", guarantees={"no_subprocess": True}, unsafe_override=True)]
    r = run_requests(tmp_path, tools, [call("AID.SVC.A.v1", {"a": 1, "b": 1}), call("AID.SVC.B.v1", {"a": 1, "b": 1}),
                                       call("AID.SVC.B.v1", {"a": 2, "b": 2})])
    assert (r[0]["code"], r[0]["status"]) == ("coverage_missing", "TOOL_ERROR")
    assert "does not enforce no_subprocess" in r[0]["error"] and r[0]["trace"]["reason_code"] == "coverage_missing"
    assert [x["ok"] for x in r[1:]] == [True, True]
    assert r[1]["trace"]["unsafe_override"] is True and r[1]["trace"]["enforcement_level"] == "not_enforceable"
    assert not [b for p, b, _ in rec.requests if p == "/run" and b["payload"] == {"a": 1, "b": 1}
                and b["tool_name"] == "AID.SVC.A.v1"]  # the refused call never reached the service
    rec.enforcement = "partially_enforced"
    rec.supported = {"no_network": True, "no_subprocess": True}
    r = run_requests(tmp_path, tools, [call("AID.SVC.A.v1", {"a": 1, "b": 1})])
    assert r[0]["code"] == "coverage_missing" and "enforcement is 'partially_enforced'" in r[0]["error"]


# --- our own server -----------------------------------------------------------------------


class HttpHost:
    def __init__(self, proc: subprocess.Popen[bytes], port: int) -> None:
        self.proc = proc
        self.port = port
        self.base = f"http://127.0.0.1:{port}"

    def post(self, path: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.request("POST", path, data, {"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        raw = resp.read()
        conn.close()
        return resp.status, json.loads(raw) if raw else None


def start_http_host(*args: str, env: dict[str, str] | None = None) -> HttpHost:
    proc = subprocess.Popen([TOOLHOST, "--http", "127.0.0.1:0", *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=base_env(env))
    assert proc.stderr is not None
    line = proc.stderr.readline().decode()
    found = re.search(r"serving HTTP on http://127\.0\.0\.1:(\d+)", line)
    assert found, line + proc.stderr.read().decode()
    return HttpHost(proc, int(found.group(1)))


@pytest.fixture
def http_host(tmp_path: Path) -> Iterator[HttpHost]:
    manifest = write_pack(tmp_path / "served", [
        python_tool("AID.PY.GREET.v1", "tools.sample_tool:greet"),
        python_tool("AID.PY.SAFE.v1", "tools.sample_tool:greet",
                    guarantees={"no_network": True, "no_subprocess": True}),
    ])
    host = start_http_host("--tools", str(manifest), env={"MACHINA_TOOLHOST_HTTP_TOKEN": "tok-1"})
    yield host
    host.proc.terminate()
    assert host.proc.wait(timeout=10) == 0


AUTH = {"Authorization": "Bearer tok-1"}


def test_the_host_serves_the_run_request_and_the_handshake(http_host: HttpHost) -> None:
    status, body = http_host.post("/run", {"protocol_version": 1, "tool_name": "AID.PY.GREET.v1",
                                           "payload": {"name": "Ada"}, "trace_id": "t-5"}, AUTH)
    assert status == 200 and body["ok"] and body["result"] == {"message": "Hello Ada", "ok": True}
    assert body["trace"]["trace_id"] == "t-5" and body["trace"]["stdout"] == "greeting Ada\n"
    status, body = http_host.post("/run", {"tool_name": "AID.PY.GREET.v1", "payload": {}}, AUTH)
    assert status == 200 and body["ok"] is False
    assert body["error"] == {"type": "ValueError", "message": "Missing input"} and body["code"] == "tool_error"
    status, body = http_host.post("/run", {"tool_name": "AID.ECHO.v1", "payload": [1, 2]}, AUTH)  # a plugin tool
    assert status == 200 and body["result"] == [1, 2]
    status, body = http_host.post("/run", {"tool_name": "AID.NOPE.v1", "payload": {}}, AUTH)
    assert status == 200 and body["code"] == "tool_not_found" and body["error"]["type"] == "tool_not_found"
    # The handshake says what is really enforced, tool by tool.
    ask = {"protocol_version": 1, "runner": "service", "required_guarantees": {"no_network": True}}
    status, body = http_host.post("/capabilities/handshake", {**ask, "tool_name": "AID.PY.SAFE.v1"}, AUTH)
    assert status == 200 and body["enforcement"] == "enforced"
    assert body["supported_guarantees"] == {"no_network": True, "no_subprocess": True}
    status, body = http_host.post("/capabilities/handshake", {**ask, "tool_name": "AID.PY.GREET.v1"}, AUTH)
    assert body["enforcement"] == "not_enforceable" and body["supported_guarantees"] == {}


def test_the_host_refuses_bad_requests_clearly(http_host: HttpHost) -> None:
    assert http_host.post("/run", {"tool_name": "AID.ECHO.v1"})[0] == 401  # no token
    assert http_host.post("/run", {"tool_name": "AID.ECHO.v1"}, {"Authorization": "Bearer nope"})[0] == 401
    status, body = http_host.post("/run", b"{not json", AUTH)
    assert status == 400 and body["error"]["type"] == "malformed_request"
    status, body = http_host.post("/run", {"payload": {}}, AUTH)
    assert status == 400 and "tool_name" in body["error"]["message"]
    status, body = http_host.post("/run", {"tool_name": "AID.ECHO.v1", "timeout_ms": "soon"}, AUTH)
    assert status == 400
    for version in (2, "1", None):
        for path in ("/run", "/capabilities/handshake"):
            status, body = http_host.post(path, {"tool_name": "AID.ECHO.v1", "protocol_version": version}, AUTH)
            assert status == 400 and "is not supported: this service speaks 1" in body["error"]["message"], body
    status, body = http_host.post("/run", {"tool_name": "AID.ECHO.v1", "protocol_version": 1, "payload": 2}, AUTH)
    assert status == 200 and body["result"] == 2
    status, body = http_host.post("/run", b'{"tool_name": "AID.ECHO.v1", "payload": "' + b"x" * (11 << 20) + b'"}',
                                  AUTH)
    assert status == 413 and body["error"]["type"] == "request_too_large"
    conn = http.client.HTTPConnection("127.0.0.1", http_host.port, timeout=30)
    conn.request("DELETE", "/run", headers=AUTH)
    assert conn.getresponse().status == 405
    conn.close()
    # Nested past 512 (the host built and dumped it recursively: this killed it before).
    deep = b"[" * 300_000 + b"]" * 300_000
    for path in ("/run", "/capabilities/handshake"):
        status, body = http_host.post(path, b'{"tool_name": "AID.ECHO.v1", "payload": ' + deep + b"}", AUTH)
        assert status == 400 and body["error"]["type"] == "malformed_request", body
        assert "nesting deeper than 512" in body["error"]["message"], body
    status, body = http_host.post("/run", {"tool_name": "AID.ECHO.v1", "payload": 1}, AUTH)  # still serving
    assert status == 200 and body["result"] == 1


def test_our_runner_against_our_own_server(tmp_path: Path, http_host: HttpHost) -> None:
    tools = [service_tool("AID.SVC.GREET.v1", f"{http_host.base}/run", name="AID.PY.GREET.v1", token_env="SVC_TOKEN"),
             service_tool("AID.SVC.SAFE.v1", f"{http_host.base}/run", name="AID.PY.SAFE.v1", token_env="SVC_TOKEN",
                          guarantees={"no_network": True}),
             service_tool("AID.SVC.OPEN.v1", f"{http_host.base}/run", name="AID.PY.GREET.v1", token_env="SVC_TOKEN",
                          guarantees={"no_network": True}),
             service_tool("AID.SVC.NOAUTH.v1", f"{http_host.base}/run", name="AID.PY.GREET.v1")]
    r = run_requests(tmp_path, tools, [call("AID.SVC.GREET.v1", {"name": "Bo"}),
                                       call("AID.SVC.SAFE.v1", {"name": "Cy"}), call("AID.SVC.OPEN.v1", {"name": "Di"}),
                                       call("AID.SVC.GREET.v1", {}), call("AID.SVC.NOAUTH.v1", {"name": "Ed"})],
                     env={"SVC_TOKEN": "tok-1"})
    assert json.loads(r[0]["output_json"]) == {"message": "Hello Bo", "ok": True}
    assert r[1]["ok"] and r[1]["trace"]["enforcement_level"] == "enforced"
    assert r[2]["code"] == "coverage_missing"  # the greeter runs unguarded over there
    assert r[3]["code"] == "tool_error" and r[3]["error"] == "ValueError: Missing input"
    assert r[4]["code"] == "service_http_error" and "HTTP 401" in r[4]["error"]


def test_a_manifest_service_needs_its_token_variable_and_an_http_url(tmp_path: Path) -> None:
    for tool, expected in [
        (service_tool("AID.S.v1", "http://127.0.0.1:1/run", token_env="NOT_SET_ANYWHERE"),
         "field 'token_env': the variable NOT_SET_ANYWHERE is not set"),
        (service_tool("AID.S.v1", "ftp://example.com/run"), "field 'url': must start with http:// or https://"),
        (service_tool("AID.S.v1", "http://tools.example/run", token_env="HOME"),
         "field 'token_env': a bearer token is sent only over https:// (or to this machine)"),
        (service_tool("AID.S.v1", "http://127.0.0.1.example/run", token_env="HOME"),
         "field 'token_env': a bearer token is sent only over https:// (or to this machine)"),
        (service_tool("AID.S.v1", "http:///run"), "field 'url': the URL has no host"),
    ]:
        manifest = write_pack(tmp_path / "bad", [tool])
        with pytest.raises(md.HostError, match=re.escape(expected)):
            md.InProcess(tools=[str(manifest)])


def test_a_packs_service_binding_calls_the_packs_service_url(
        tmp_path: Path, stdlib_service: tuple[str, Recorder]) -> None:
    """namel3ss's service pack layout: runners.default service and service_url in pack.yaml."""
    base, rec = stdlib_service
    pack = tmp_path / "sums"
    pack.mkdir()
    (pack / "pack.yaml").write_text(
        'id: "team.sums"\nname: "Sums"\nversion: "1.0"\ndescription: "Adds."\nauthor: "T"\nlicense: "MIT"\n'
        f'tools:\n  - "add numbers"\nrunners:\n  default: "service"\nservice_url: "{base}/run"\n')
    (pack / "tools.yaml").write_text('tools:\n  "add numbers":\n    kind: "python"\n    entry: "service.sums:add"\n')
    [r] = serve([call("AID.PACK.TEAM_SUMS.ADD_NUMBERS.v1", {"a": 2, "b": 5})], "--tools", str(pack))
    assert r["ok"] is True and json.loads(r["output_json"]) == {"sum": 7}, r
    [(path, body, _)] = rec.requests
    assert path == "/run" and body["tool_name"] == "add numbers" and body["entry"] == "service.sums:add"
    trace = r["trace"]
    assert (trace["runner"], trace["service_url"], trace["resolved_source"]) == ("service", f"{base}/run",
                                                                                 "installed_pack")
    assert (trace["pack_id"], trace["pack_name"], trace["pack_version"]) == ("team.sums", "Sums", "1.0")
    assert "python_env" in trace
