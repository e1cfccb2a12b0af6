"""One rule for the names a tool answers to, and one for the schema it is advertised with, in
every front: a tool addressed by its aid, an alias, its display name or the function name the
LLM formats declare it under (plain, or hashed for an aid those formats cannot spell) reaches
the same tool over --http, --mcp, --nats and machina_dispatch.llm; --list, MCP's tools/list,
NATS's machina.tools and $SRV.INFO, and the LLM declarations advertise the same schema."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import machina_dispatch as md
import pytest
from conftest import TOOLHOST, base_env
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonrpc_support import LineClient, manifest, mcp_server_command, skill_env
from machina_dispatch import _core
from machina_dispatch.llm import ToolCatalog, run_tool_calls, tool_name
from nats.micro.service import ServiceInfo
from nats_support import Front, nats_server
from python_support import manifest_text
from test_nats import request as nats_request
from test_security_http import http_request, start

RESUME = "AID.NAMES.résumé.v1"  # not a name the LLM formats can spell: hashed
LONG = "AID.NAMES." + "VERY_LONG_PART." * 4 + "v1"  # plain characters, past 64: hashed
ODD = "AID.NAMES.with space.v1"  # a character NATS subjects cannot hold either

WHOAMI = '''
def resume(payload):
    return {"tool": "resume", "payload": payload}


def long(payload):
    return {"tool": "long", "payload": payload}


def odd(payload):
    return {"tool": "odd", "payload": payload}
'''


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A manifest of three Python tools whose aids the LLM formats name with a hash, and a
    workspace beside it (notes.txt)."""
    folder = tmp_path_factory.mktemp("names")
    (folder / "ntools").mkdir()
    (folder / "ntools" / "__init__.py").write_text("")
    (folder / "ntools" / "whoami.py").write_text(WHOAMI)
    (folder / "ws").mkdir()
    (folder / "ws" / "notes.txt").write_text("hello\n")
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    tools: list[dict[str, Any]] = [
        {"aid": RESUME, "name": "names_resume", "runner": "python", "entry": "ntools.whoami:resume",
         "description": "Says which tool it is", "input_schema": schema},
        {"aid": LONG, "runner": "python", "entry": "ntools.whoami:long", "input_schema": schema},
        {"aid": ODD, "runner": "python", "entry": "ntools.whoami:odd", "description": "odd", "tier": 1},
    ]
    path = folder / "tools.toml"
    path.write_text(manifest_text(tools), encoding="utf-8")
    return path


def env_of(pack: Path) -> dict[str, str]:
    return base_env({"MACHINA_TOOLHOST_WORKSPACE": str(pack.parent / "ws")})


@pytest.fixture(scope="module")
def inprocess(pack: Path) -> Iterator[md.InProcess]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MACHINA_TOOLHOST_WORKSPACE", str(pack.parent / "ws"))
        with md.InProcess(tools=[str(pack)]) as host:
            yield host


@pytest.fixture(scope="module")
def listing(pack: Path) -> list[dict[str, Any]]:
    proc = subprocess.run([TOOLHOST, "--tools", str(pack), "--list"], capture_output=True, env=env_of(pack),
                          timeout=60, check=True)
    tools: list[dict[str, Any]] = json.loads(proc.stdout)["tools"]
    return tools


def llm_name(aid: str) -> str:
    """The name the LLM formats declare `aid` under, as a catalog of every tool gives it."""
    return tool_name(aid)


def addresses() -> list[tuple[str, str, Any, Any]]:
    """(name, the aid it stands for, payload, the tool's output)."""
    x = {"x": 1}
    return [
        ("AID.ECHO.v1", "AID.ECHO.v1", x, x),                       # an aid
        ("echo", "AID.ECHO.v1", x, x),                              # its display name
        ("AID-ECHO-v1", "AID.ECHO.v1", x, x),                       # its LLM name, plain
        ("tools.file.read", "tools.file.read", {"path": "notes.txt"}, "hello\n"),  # an alias (a tools.* name)
        ("readFile", "readFile", {"path": "notes.txt"}, "hello\n"),                # another alias
        ("tools-file-read", "tools.file.read", {"path": "notes.txt"}, "hello\n"),  # an alias's LLM name
        (RESUME, RESUME, x, {"tool": "resume", "payload": x}),
        ("names_resume", RESUME, x, {"tool": "resume", "payload": x}),
        (llm_name(RESUME), RESUME, x, {"tool": "resume", "payload": x}),      # hashed
        (LONG, LONG, x, {"tool": "long", "payload": x}),
        (llm_name(LONG), LONG, x, {"tool": "long", "payload": x}),            # hashed
        (llm_name(ODD), ODD, x, {"tool": "odd", "payload": x}),              # hashed
    ]


def test_the_hashed_names_are_what_the_docs_say() -> None:
    assert llm_name(RESUME) == "AID-NAMES-r_sum_-v1-" + hashlib.sha256(f"0:{RESUME}".encode()).hexdigest()[:12]
    assert llm_name(LONG).startswith("AID-NAMES-VERY_LONG_PART-") and len(llm_name(LONG)) == 64
    assert llm_name(ODD).startswith("AID-NAMES-with_space-v1-")


def test_the_host_resolves_every_name_of_every_tool(inprocess: md.InProcess, listing: list[dict[str, Any]]) -> None:
    resolve = inprocess.host.resolve_tool
    for name, aid, _, _ in addresses():
        assert resolve(name) == aid, name
    catalog = ToolCatalog(listing, include_aliases=True)
    names = [t["name"] for t in listing]
    for t in listing:
        assert resolve(t["aid"]) == t["aid"]
        assert resolve(catalog.name_for(t["aid"])) == t["aid"], t["aid"]
        if names.count(t["name"]) == 1:
            assert resolve(t["name"]) == t["aid"], t["name"]
    for unknown in ("AID.NOPE.v1", "AID-NOPE-v1", "", "AID-NAMES-r_sum_-v1-000000000000", "aid.echo.v1"):
        assert resolve(unknown) is None, unknown


def test_http_resolves_every_name(pack: Path) -> None:
    host = start(pack.parent / "ws", "--tools", str(pack), env={"MACHINA_TOOLHOST_WORKSPACE": str(pack.parent / "ws")})
    try:
        own = {"Host": f"127.0.0.1:{host.port}", "Content-Type": "application/json"}
        for name, _, payload, output in addresses():
            body = json.dumps({"tool_name": name, "payload": payload}).encode()
            status, _, answer = http_request(host.port, own, body)
            assert status == 200 and answer["ok"] and answer["result"] == output, (name, answer)
        status, _, answer = http_request(host.port, own, b'{"payload": {"x": 2}}', path=f"/tools/{llm_name(RESUME)}")
        assert status == 200 and answer["result"] == {"tool": "resume", "payload": {"x": 2}}, answer
        status, _, answer = http_request(host.port, own, b'{"tool_name": "AID-NOPE-v1"}')
        assert status == 200 and answer["code"] == "tool_not_found", answer
    finally:
        host.proc.terminate()
        assert host.proc.wait(timeout=10) == 0


def mcp_client(pack: Path) -> LineClient:
    c = LineClient([TOOLHOST, "--mcp", "--tools", str(pack)], env=env_of(pack))
    c.result("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                            "clientInfo": {"name": "tests", "version": "0"}})
    return c


def test_mcp_resolves_every_name(pack: Path) -> None:
    with mcp_client(pack) as c:
        for name, _, payload, output in addresses():
            result = c.result("tools/call", {"name": name, "arguments": payload})
            text = result["content"][0]["text"]  # (a string output is its own text)
            assert result["isError"] is False, (name, result)
            assert (text if isinstance(output, str) else json.loads(text)) == output, (name, result)
        answer = c.answer(c.send("tools/call", {"name": "AID-NOPE-v1", "arguments": {}}))
        assert answer["error"]["data"]["code"] == "tool_not_found", answer


def openai_call(name: str, payload: Any) -> dict[str, Any]:
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": json.dumps(payload)}}


def test_native_nats_resolves_every_name(pack: Path, tmp_path: Path) -> None:
    with nats_server(jetstream=False) as url, \
            Front(url, ["--prefix", "names", "--tools", str(pack)], env={"MACHINA_TOOLHOST_WORKSPACE":
                                                                        str(pack.parent / "ws")},
                  log_dir=tmp_path):
        # A hashed name first: the name a catalog declares a tool under whose aid it cannot spell.
        body, headers = nats_request(url, "names.call", openai_call(llm_name(RESUME), {"x": 5}))
        assert "Nats-Service-Error" not in headers, (body, headers)
        assert json.loads(body["content"]) == {"tool": "resume", "payload": {"x": 5}}, (body, headers)
        for name, _, payload, output in addresses():
            body, headers = nats_request(url, "names.call", openai_call(name, payload))
            content = body["content"]
            assert "Nats-Service-Error" not in headers, (name, body)
            assert (content if isinstance(output, str) else json.loads(content)) == output, (name, body)
            assert body["name"] == name and body["tool_call_id"] == "call_1"
        # On a tool's own subject, a name of another tool is refused; a name of its own is not.
        body, _ = nats_request(url, "names.tool.AID.ECHO.v1", openai_call("echo", {"x": 3}))
        assert json.loads(body["content"]) == {"x": 3}, body
        body, headers = nats_request(url, "names.tool.AID.ECHO.v1", openai_call(llm_name(RESUME), {"x": 3}))
        assert headers["Nats-Service-Error-Code"] == "400" and "is not the tool of subject" in body["content"], body
        body, headers = nats_request(url, "names.call", openai_call("AID-NOPE-v1", {}))
        assert headers["Machina-Error-Code"] == "tool_not_found", (body, headers)


def test_llm_catalog_calls_every_llm_name(inprocess: md.InProcess) -> None:
    catalog = ToolCatalog.from_transport(inprocess, include_aliases=True)
    for name, aid, payload, output in addresses():
        if "." in name or name in ("echo", "names_resume"):
            continue  # (a model calls tools by their declared names alone)
        assert catalog.aid_for(name) == aid
        out = run_tool_calls(inprocess, [{"type": "tool_use", "id": "toolu_1", "name": name, "input": payload}],
                             catalog)
        assert "is_error" not in out[0] and json.loads(out[0]["content"]) == output, (name, out)


# --- the advertised schema ---------------------------------------------------------------------


def mcp_tools(pack: Path) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = []
    with mcp_client(pack) as c:
        cursor: str | None = None
        while True:
            page = c.result("tools/list", {"cursor": cursor} if cursor else {})
            tools += page["tools"]
            cursor = page.get("nextCursor")
            if not cursor:
                return tools


def test_every_front_advertises_the_same_schema(pack: Path, listing: list[dict[str, Any]], inprocess: md.InProcess,
                                                tmp_path: Path) -> None:
    primary = [t for t in listing if not t.get("alias_of")]
    by_aid = {t["aid"]: t for t in primary}
    mcp = {t["name"]: t for t in mcp_tools(pack)}
    assert list(mcp) == list(by_aid)  # the same tools, in the same order, aliases left out
    catalog = ToolCatalog(listing)
    chat = {d["function"]["name"]: d["function"] for d in catalog.openai_chat()}
    anthropic = {d["name"]: d for d in catalog.anthropic()}
    assert list(chat) == [catalog.name_for(a) for a in by_aid]
    for aid, t in by_aid.items():
        advertised = json.loads(_core.advertised_input_schema(json.dumps(t["input_schema"])))
        assert advertised["type"] == "object"
        if isinstance(t["input_schema"], dict) and t["input_schema"].get("type") == "object":
            assert advertised == t["input_schema"]
        name = catalog.name_for(aid)
        assert mcp[aid]["inputSchema"] == advertised == chat[name]["parameters"] == anthropic[name]["input_schema"], aid
        assert mcp[aid]["description"] == t["description"] == chat[name].get("description", ""), aid
    assert mcp[ODD]["annotations"]["readOnlyHint"] is False  # tier 1
    assert chat[llm_name(RESUME)]["parameters"] == {"type": "object", "properties": {"x": {"type": "integer"}}}
    assert by_aid["AID.ECHO.v1"]["input_schema"] is None and mcp["AID.ECHO.v1"]["inputSchema"] == {"type": "object"}
    # Over NATS: machina.tools is the --list; $SRV.INFO names each tool's endpoint by its aid.
    with nats_server(jetstream=False) as url, \
            Front(url, ["--prefix", "schemas", "--tools", str(pack)], log_dir=tmp_path) as front:
        listed = nats_request(url, "schemas.tools", b"")[0]
        info = ServiceInfo.from_dict(nats_request(url, f"$SRV.INFO.machina-toolhost.{front.service_id}", b"")[0])
    assert [dict(t, plugin="", timeout_ms=0) for t in listed] == [dict(t, plugin="", timeout_ms=0) for t in listing]
    endpoint_aids = {e.metadata["aid"] for e in info.endpoints if e.metadata and "aid" in e.metadata}
    assert endpoint_aids <= {t["aid"] for t in listing}
    assert {a for a in by_aid if re.fullmatch(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*", a)} <= endpoint_aids
    assert RESUME not in endpoint_aids and ODD not in endpoint_aids  # (no subject can name them)


@pytest.mark.parametrize("tier", [0, 2])
def test_list_shows_a_hosted_tools_hints_as_mcp_does(tmp_path: Path, tier: int) -> None:
    # The server says its add tool is read-only; the operator may declare it tier 2.
    m = manifest(tmp_path, [("mcp_server", {"name": "sdk", "command": mcp_server_command(), "tier": tier})])
    proc = subprocess.run([TOOLHOST, "--tools", str(m), "--list"], capture_output=True, env=skill_env(tmp_path),
                          timeout=60, check=True)
    listed = {t["aid"]: t for t in json.loads(proc.stdout)["tools"]}
    with LineClient([TOOLHOST, "--mcp", "--tools", str(m)], env=skill_env(tmp_path)) as c:
        c.result("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                "clientInfo": {"name": "tests", "version": "0"}})
        mcp = {t["name"]: t for t in c.result("tools/list", {})["tools"]}
    for aid, t in mcp.items():
        if "annotations" in listed[aid]:
            assert listed[aid]["annotations"] == t["annotations"], aid
    add = listed["AID.MCP.SDK.ADD.v1"]["annotations"]
    assert add == ({"readOnlyHint": True, "idempotentHint": True} if tier == 0 else
                   {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": True}), add


# --- the hashing rule, in C++ alone; its documented form ----------------------------------------


def documented_name(aid: str, salt: int = 0) -> str:
    """docs/llm-tools.md's rule, written out here from the text."""
    if re.fullmatch(r"[A-Za-z0-9_.]{1,64}", aid):
        return aid.replace(".", "-")
    digest = hashlib.sha256(f"{salt}:{aid}".encode("utf-8", "surrogatepass")).hexdigest()[:12]
    stem = re.sub(r"[^A-Za-z0-9_-]", "_", aid.replace(".", "-"))[:51]
    return f"{stem}-{digest}" if stem else f"tool-{digest}"


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.text(max_size=90), st.from_regex(r"[A-Za-z0-9_.-]{50,80}", fullmatch=True),
                 st.text(alphabet=st.characters(codec="utf-8") | st.characters(categories=["Cs"]), max_size=70)))
def test_core_names_follow_the_documented_rule(aid: str) -> None:
    assert tool_name(aid) == documented_name(aid)
    assert _core.llm_function_names([aid.encode("utf-8", "surrogatepass")]) == [documented_name(aid)]


def test_python_keeps_no_copy_of_the_rule() -> None:
    source = (Path(md.__file__).parent / "llm.py").read_text()
    assert "sha256" not in source and "hashlib" not in source
