"""machina_dispatch.llm: tool declarations for the OpenAI Chat, OpenAI Responses and Anthropic
Messages APIs, names mapped reversibly to aids, and a model output's tool calls run over a
transport (in this process and through a pool), answered in each API's shape. The model
outputs are the shapes recorded in the design's PROTOCOLS.md ("LLM tool-call shapes"); no
network."""

from __future__ import annotations

import asyncio
import copy
import json
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import machina_dispatch as md
import pytest
from conftest import REPO, TOOLHOST, base_env
from hypothesis import given, settings
from hypothesis import strategies as st
from machina_dispatch.llm import (
    ToolCall,
    ToolCatalog,
    arun_tool_calls,
    parse_tool_calls,
    run_tool_calls,
    tool_name,
)

NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule; Anthropic's is the same
APIS = ("openai_chat", "openai_responses", "anthropic")
NOTE = "to be or not to be\n"


# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The file tools' root (for the in-process host too, which reads the variable)."""
    ws = tmp_path_factory.mktemp("llm-ws")
    (ws / "notes.txt").write_text(NOTE)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MACHINA_TOOLHOST_WORKSPACE", str(ws))
        yield ws


@pytest.fixture(scope="module")
def inprocess(workspace: Path) -> Iterator[md.InProcess]:
    with md.InProcess() as host:
        yield host


@pytest.fixture(scope="module")
def pool(workspace: Path) -> Iterator[md.Pool]:
    with md.Pool(processes=2, env=base_env({"MACHINA_TOOLHOST_WORKSPACE": str(workspace)})) as p:
        yield p


@pytest.fixture(scope="module")
def catalog(inprocess: md.InProcess) -> ToolCatalog:
    return ToolCatalog.from_transport(inprocess)


@pytest.fixture(params=["inprocess", "pool"])
def transport(request: pytest.FixtureRequest) -> md.Transport:
    t: md.Transport = request.getfixturevalue(request.param)
    return t


Runner = Callable[..., list[dict[str, Any]]]


def run_sync(*args: Any, **kw: Any) -> list[dict[str, Any]]:
    return run_tool_calls(*args, **kw)


def run_async(*args: Any, **kw: Any) -> list[dict[str, Any]]:
    return asyncio.run(arun_tool_calls(*args, **kw))


@pytest.fixture(params=[run_sync, run_async], ids=["sync", "asyncio"])
def run(request: pytest.FixtureRequest) -> Runner:
    runner: Runner = request.param
    return runner


# --- recorded shapes (PROTOCOLS.md), naming our tools -----------------------------------------

def chat_completion() -> dict[str, Any]:
    """A Chat Completions response whose assistant message calls five tools in parallel."""
    return {
        "id": "chatcmpl-9xQ2mEJk1rGZ7pLh3vT0aB4c", "object": "chat.completion", "created": 1727389003,
        "model": "gpt-4o-2024-08-06",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": None, "message": {
            "role": "assistant", "content": None, "refusal": None, "tool_calls": [
                {"id": "call_abc123", "type": "function",
                 "function": {"name": "AID-TEXT-STATS-v1", "arguments": "{\"text\": \"to be or not to be\"}"}},
                {"id": "call_Q5xM0rPz9yKa1sLb2cTd3eUf", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"location\": \"Paris, France\"}"}},
                {"id": "call_w8Hn2Vb6Jk4Lm1Qp7Rs3Tx9Y", "type": "function",
                 "function": {"name": "AID-FILE-READ-v1", "arguments": "{\"path\": \"notes.txt\""}},
                {"id": "call_Zz1Yy2Xx3Ww4Vv5Uu6Tt7Ss8", "type": "function",
                 "function": {"name": "AID-FILE-READ-v1", "arguments": "{\"path\": \"missing.txt\"}"}},
                {"id": "call_Aa1Bb2Cc3Dd4Ee5Ff6Gg7Hh8", "type": "function",
                 "function": {"name": "AID-FILE-READ-v1", "arguments": "{\"path\": \"notes.txt\", \"max_bytes\": 5}"}},
            ]}}],
        "usage": {"prompt_tokens": 412, "completion_tokens": 121, "total_tokens": 533},
    }


def responses_output() -> dict[str, Any]:
    """A Responses API response: a reasoning item, a message, and four function_call items."""
    return {
        "id": "resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b", "object": "response", "status": "completed",
        "model": "gpt-4.1-2025-04-14",
        "output": [
            {"type": "reasoning", "id": "rs_67ccd2c0a3548190a9d1b9b7c1a5e4c1", "summary": []},
            {"type": "message", "id": "msg_67ccd2bf17f0819081ff3bb2cf6508e6", "status": "completed",
             "role": "assistant", "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
            {"type": "function_call", "id": "fc_67ca09c5efe0819096d0511c92b8c890096610f474011cc0",
             "call_id": "call_unLAR8MvFNptuiZK6K6HCy5k", "name": "AID-TEXT-STATS-v1",
             "arguments": "{\"text\": \"to be or not to be\", \"top\": 1}", "status": "completed"},
            {"type": "function_call", "id": "fc_67ca09c6bedc8190a7abfec07b1a1332096610f474011cc0",
             "call_id": "call_9bXc2Ue4Kq7WmNp0Ls3Rt6Vy", "name": "AID-ECHO-v1",
             "arguments": "[1, 2]", "status": "completed"},
            {"type": "function_call", "id": "fc_67ca09c7c1fc8190a4b2d0e0cd5e7b30096610f474011cc0",
             "call_id": "call_Hj5Kl8Mn1Op4Qr7St0Uv3Wx6", "name": "AID-JSON-POINTER-v1",
             "arguments": "{\"document\": {\"a\": [10, 20]}, \"pointer\": \"/a/1\"}", "status": "completed"},
            {"type": "function_call", "id": "fc_67ca09c8a9e48190bd7cc1c5e0d3f4a6096610f474011cc0",
             "call_id": "call_Pq2Rs5Tu8Vw1Xy4Za7Bc0De3", "name": "AID-TEXT-STATS-v1",
             "arguments": "{\"text\": 5}", "status": "completed"},
        ],
    }


def anthropic_message() -> dict[str, Any]:
    """An Anthropic Messages response: a text block and four tool_use blocks."""
    return {
        "id": "msg_01Aq9w938a90dw8q", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
        "stop_reason": "tool_use", "stop_sequence": None,
        "content": [
            {"type": "text", "text": "I'll read the notes and count their words."},
            {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "AID-FILE-READ-v1",
             "input": {"path": "notes.txt"}},
            {"type": "tool_use", "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "name": "AID-TEXT-STATS-v1",
             "input": {"text": "to be or not to be"}},
            {"type": "tool_use", "id": "toolu_01Xk9Qw2Er5Ty8Ui1Op4As7D", "name": "AID.TEXT.STATS.v1",
             "input": {"text": "the aid itself is not a declared name"}},
            {"type": "tool_use", "id": "toolu_01Zm3Nb6Vc9Xz2Lk5Jh8Gf1D", "name": "AID-ECHO-v1",
             "input": ["not", "an", "object"]},
            {"type": "tool_use", "id": "toolu_01Qa2Ws3Ed4Rf5Tg6Yh7Uj8I", "name": "AID-FILE-READ-v1",
             "input": {"path": "../outside.txt"}},
        ],
        "usage": {"input_tokens": 933, "output_tokens": 187},
    }


def error_of(content: str) -> dict[str, Any]:
    decoded = json.loads(content)
    assert set(decoded) == {"error"}, decoded
    error: dict[str, Any] = decoded["error"]
    assert {"kind", "code", "message"} <= set(error) and error["message"], error
    return error


def stats(text: str, **kw: Any) -> Any:
    """What text_stats says, called directly."""
    with md.InProcess(packs=[]) as host:
        return host.call("AID.TEXT.STATS.v1", {"text": text, **kw}).output


# --- declarations -----------------------------------------------------------------------------


def declared(api: str, decl: dict[str, Any]) -> tuple[str, str | None, dict[str, Any]]:
    """A declaration's name, description and schema, after checking its exact shape."""
    if api == "openai_chat":
        assert set(decl) == {"type", "function"} and decl["type"] == "function", decl
        fn = decl["function"]
        assert set(fn) <= {"name", "description", "parameters"} and {"name", "parameters"} <= set(fn), fn
        return fn["name"], fn.get("description"), fn["parameters"]
    if api == "openai_responses":
        assert set(decl) <= {"type", "name", "description", "parameters", "strict"}, decl
        assert decl["type"] == "function" and decl["strict"] is False, decl
        return decl["name"], decl.get("description"), decl["parameters"]
    assert set(decl) <= {"name", "description", "input_schema"} and {"name", "input_schema"} <= set(decl), decl
    return decl["name"], decl.get("description"), decl["input_schema"]


@pytest.mark.parametrize("api", APIS)
def test_every_registered_tool_is_declared_in_the_apis_shape(inprocess: md.InProcess, catalog: ToolCatalog,
                                                              api: str) -> None:
    tools = inprocess.host.list_tools()
    originals = {t["aid"]: t for t in tools if not t.get("alias_of")}
    assert len(originals) == 16 and len(tools) == 36  # the built-in tools and the packs' (and their aliases)
    decls = getattr(catalog, api)()
    assert decls == catalog.declarations(api)  # type: ignore[arg-type]
    json.dumps(decls)  # sendable as they are
    names = []
    for decl in decls:
        name, description, schema = declared(api, decl)
        assert NAME.match(name), name
        aid = catalog.aid_for(name)
        assert aid is not None and aid in originals and catalog.name_for(aid) == name
        tool = originals[aid]
        assert description == tool["description"]
        assert schema == (tool["input_schema"] or {"type": "object"})
        assert schema["type"] == "object"
        names.append(name)
    assert sorted(catalog.aid_for(n) or "" for n in names) == sorted(originals)  # each once, aliases left out
    assert "AID-FILE-READ-v1" in names and "AID-ECHO-v1" in names
    assert catalog.aid_for("tools-file-read") is None and catalog.aid_for("readFile") is None


def test_declarations_are_fresh_copies(catalog: ToolCatalog) -> None:
    first = catalog.anthropic()
    first[1]["input_schema"]["properties"].clear()
    first[1]["name"] = "changed"
    assert catalog.anthropic() != first
    assert catalog.anthropic()[1]["input_schema"]["properties"]


def test_aliases_can_be_declared_and_tools_chosen(inprocess: md.InProcess) -> None:
    tools = inprocess.host.list_tools()
    everything = ToolCatalog(tools, include_aliases=True)
    assert len(everything) == 36
    assert everything.aid_for("tools-file-read") == "tools.file.read"
    assert everything.aid_for("readFile") == "readFile"
    assert everything.name_for("tools.shell.exec") == "tools-shell-exec"
    readers = ToolCatalog(tools, where=lambda t: t["tier"] == 0)
    assert "AID.FILE.READ.v1" in readers and "AID.FILE.WRITE.v1" not in readers
    assert {d["name"] for d in readers.anthropic()} == {readers.name_for(t["aid"]) for t in readers.tools}
    with pytest.raises(KeyError):
        readers.name_for("AID.SHELL.EXEC.v1")


def test_a_tool_left_out_of_the_catalog_cannot_be_called(inprocess: md.InProcess, workspace: Path) -> None:
    readers = ToolCatalog(inprocess.host.list_tools(), where=lambda t: t["tier"] == 0)
    out = run_tool_calls(inprocess, [{"type": "tool_use", "id": "toolu_01W", "name": "AID-FILE-WRITE-v1",
                                      "input": {"path": "written.txt", "content": "x"}}], readers)
    assert out[0]["is_error"] is True and error_of(out[0]["content"])["kind"] == "tool_not_found"
    assert not (workspace / "written.txt").exists()


def test_the_catalog_is_the_same_from_every_transport(catalog: ToolCatalog, pool: md.Pool, workspace: Path) -> None:
    def by_name(c: ToolCatalog) -> dict[str, Any]:
        return {d["function"]["name"]: d for d in c.openai_chat()}

    with md.Spawn(env=base_env({"MACHINA_TOOLHOST_WORKSPACE": str(workspace)})) as spawn:
        assert by_name(ToolCatalog.from_transport(spawn)) == by_name(catalog)
    assert by_name(ToolCatalog.from_transport(pool)) == by_name(catalog)
    listing = json.loads(subprocess.run([TOOLHOST, "--list"], capture_output=True, check=True, env=base_env()).stdout)
    assert by_name(ToolCatalog(listing)) == by_name(catalog)  # the --list envelope itself


def test_a_transport_that_cannot_list_its_tools() -> None:
    class Listing(Recording):
        def list_tools(self) -> list[dict[str, Any]]:
            return [{"aid": "AID.ECHO.v1", "input_schema": None}]

    assert ToolCatalog.from_transport(Listing()).anthropic() == [{"name": "AID-ECHO-v1",
                                                                  "input_schema": {"type": "object"}}]
    with pytest.raises(TypeError, match="cannot list its tools"):
        ToolCatalog.from_transport(Recording())
    with pytest.raises(ValueError, match="aid"):
        ToolCatalog([{"name": "no aid"}])


# --- names ------------------------------------------------------------------------------------


def test_names_of_the_projects_aids() -> None:
    assert tool_name("AID.FILE.READ.v1") == "AID-FILE-READ-v1"
    assert tool_name("tools.file.read") == "tools-file-read"
    assert tool_name("readFile") == "readFile"
    assert tool_name("AID.MCP.FILES.READ_FILE.v1") == "AID-MCP-FILES-READ_FILE-v1"
    long_aid = "AID." + "VERY_LONG_NAMESPACE." * 4 + "TOOL.v1"
    odd = [long_aid, "AID.PLUGIN.résumé.v1", "AID.X-Y.v1", "a tool with spaces", "x" * 65, ""]
    for aid in odd:
        name = tool_name(aid)
        assert NAME.match(name), name
        assert name != aid.replace(".", "-")
    assert tool_name(long_aid).startswith("AID-VERY_LONG_NAMESPACE-")
    assert tool_name("AID.X-Y.v1") != tool_name("AID.X_Y.v1")
    catalog = ToolCatalog([{"aid": a} for a in odd])
    assert [catalog.aid_for(catalog.name_for(a)) for a in odd] == odd


@settings(max_examples=300, deadline=None)
@given(st.from_regex(r"[A-Za-z0-9_.]{1,64}", fullmatch=True))
def test_plain_aids_map_one_to_one_without_a_catalog(aid: str) -> None:
    name = tool_name(aid)
    assert NAME.match(name) and name.replace("-", ".") == aid


AID_LIKE = st.one_of(
    st.from_regex(r"AID(\.[A-Z][A-Z0-9_]{0,20}){1,4}\.v[0-9]{1,2}", fullmatch=True),
    st.from_regex(r"[a-z]{1,8}(\.[a-z]{1,8}){0,3}", fullmatch=True),
    st.from_regex(r"[A-Za-z0-9_.-]{60,90}", fullmatch=True),
    st.text(min_size=1, max_size=80),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(AID_LIKE, max_size=12, unique=True))
def test_catalog_names_are_valid_distinct_and_reversible(aids: list[str]) -> None:
    catalog = ToolCatalog([{"aid": a, "description": "d", "input_schema": None} for a in aids])
    names = [catalog.name_for(a) for a in aids]
    assert all(NAME.match(n) for n in names), names
    assert len(set(names)) == len(names)
    assert [catalog.aid_for(n) for n in names] == aids
    for api in APIS:
        assert [declared(api, d)[0] for d in catalog.declarations(api)] == names  # type: ignore[arg-type]


def test_a_plain_aid_keeps_its_name_when_a_hashed_name_would_clash() -> None:
    long_aid = "AID." + "N" * 70 + ".v1"
    plain = tool_name(long_aid).replace("-", ".")  # the plain aid whose name is the long aid's
    assert tool_name(plain) == tool_name(long_aid)
    for order in ([long_aid, plain], [plain, long_aid]):
        catalog = ToolCatalog([{"aid": a} for a in order])
        assert catalog.name_for(plain) == tool_name(plain)
        assert catalog.name_for(long_aid) != catalog.name_for(plain)
        assert NAME.match(catalog.name_for(long_aid))
        assert {catalog.aid_for(catalog.name_for(a)) for a in order} == set(order)


# --- running a model's calls ------------------------------------------------------------------


def test_openai_chat_calls(transport: md.Transport, catalog: ToolCatalog, run: Runner) -> None:
    completion = chat_completion()
    message = completion["choices"][0]["message"]
    out = run(transport, message, catalog)
    ids = [c["id"] for c in message["tool_calls"]]
    assert [m["tool_call_id"] for m in out] == ids  # one each, in order
    assert all(set(m) == {"role", "tool_call_id", "content"} and m["role"] == "tool" for m in out)
    assert json.loads(out[0]["content"]) == stats("to be or not to be")
    unknown = error_of(out[1]["content"])
    assert unknown == {"kind": "tool_not_found", "code": "tool_not_found",
                       "message": "no tool named 'get_weather' is declared"}
    bad_json = error_of(out[2]["content"])
    assert bad_json["kind"] == "invalid_input" and bad_json["message"].startswith("arguments are not JSON")
    missing = error_of(out[3]["content"])
    assert missing["kind"] == "target_not_found" and "missing.txt" in missing["message"]
    assert json.loads(out[4]["content"]) == {"path": "notes.txt", "content": NOTE[:5], "truncated": True,
                                             "size": len(NOTE)}
    # The whole completion and the bare tool_calls list are answered alike.
    assert run(transport, completion, catalog) == out
    assert run(transport, message["tool_calls"], catalog, api="openai_chat") == out


def test_arguments_nested_past_the_interpreters_limit_are_refused(transport: md.Transport, catalog: ToolCatalog,
                                                                  run: Runner) -> None:
    deep = '{"text": ' + "[" * 100_000 + "]" * 100_000 + "}"
    calls = [{"id": "call_deep", "type": "function", "function": {"name": "AID-TEXT-STATS-v1", "arguments": deep}},
             {"id": "call_ok", "type": "function",
              "function": {"name": "AID-TEXT-STATS-v1", "arguments": "{\"text\": \"to be\"}"}}]
    out = run(transport, calls, catalog, api="openai_chat")
    bad = error_of(out[0]["content"])
    assert bad["kind"] == "invalid_input" and bad["message"].startswith("arguments are not JSON"), bad
    assert json.loads(out[1]["content"]) == stats("to be")


def test_openai_responses_calls(transport: md.Transport, catalog: ToolCatalog, run: Runner) -> None:
    response = responses_output()
    out = run(transport, response, catalog)
    calls = [i for i in response["output"] if i["type"] == "function_call"]
    assert [m["call_id"] for m in out] == [c["call_id"] for c in calls]  # call_id, not the item's fc_ id
    assert all(set(m) == {"type", "call_id", "output"} and m["type"] == "function_call_output" for m in out)
    assert json.loads(out[0]["output"]) == stats("to be or not to be", top=1)
    not_object = error_of(out[1]["output"])
    assert not_object["kind"] == "invalid_input" and "JSON object, not list" in not_object["message"]
    assert json.loads(out[2]["output"]) == {"found": True, "value": 20}
    schema = error_of(out[3]["output"])
    assert schema["kind"] == schema["code"] == "schema_violation"
    assert run(transport, response["output"], catalog) == out


def test_anthropic_calls(transport: md.Transport, catalog: ToolCatalog, run: Runner) -> None:
    message = anthropic_message()
    out = run(transport, message, catalog)
    uses = [b for b in message["content"] if b["type"] == "tool_use"]
    assert [m["tool_use_id"] for m in out] == [b["id"] for b in uses]
    assert [m.get("is_error", False) for m in out] == [False, False, True, True, True]
    assert all(m["type"] == "tool_result" and set(m) <= {"type", "tool_use_id", "content", "is_error"} for m in out)
    assert json.loads(out[0]["content"]) == {"path": "notes.txt", "content": NOTE, "truncated": False,
                                             "size": len(NOTE)}
    assert json.loads(out[1]["content"]) == stats("to be or not to be")
    assert error_of(out[2]["content"])["kind"] == "tool_not_found"  # names are declared names, not aids
    assert error_of(out[3]["content"])["message"] == "input must be an object, not list"
    assert error_of(out[4]["content"])["kind"] in {"access_denied", "target_not_found"}
    assert run(transport, message["content"], catalog) == out


def test_pool_and_in_process_answer_alike(inprocess: md.InProcess, pool: md.Pool, catalog: ToolCatalog) -> None:
    for output in (chat_completion(), responses_output(), anthropic_message()):
        assert run_tool_calls(pool, output, catalog) == run_tool_calls(inprocess, output, catalog)


def test_no_calls_no_results(inprocess: md.InProcess, catalog: ToolCatalog) -> None:
    assert run_tool_calls(inprocess, {"role": "assistant", "content": "Hello!", "refusal": None}, catalog) == []
    assert run_tool_calls(inprocess, {"role": "assistant", "content": [{"type": "text", "text": "Hi"}]},
                          catalog) == []
    assert run_tool_calls(inprocess, {"object": "response", "output": []}, catalog) == []
    assert run_tool_calls(inprocess, [], catalog) == []


def test_lenient_arguments(inprocess: md.InProcess, catalog: ToolCatalog) -> None:
    calls = [{"id": f"call_{i}", "type": "function", "function": {"name": "AID-ECHO-v1", "arguments": a}}
             for i, a in enumerate(["", "  ", {"k": 1}, '{"n": NaN}', "5", '{"big": 123456789012345678901234567890}'])]
    out = run_tool_calls(inprocess, calls, catalog)
    assert [m["content"] for m in out[:3]] == ["{}", "{}", '{"k":1}']
    assert error_of(out[3]["content"])["kind"] == "invalid_input"
    assert "JSON object, not int" in error_of(out[4]["content"])["message"]
    assert json.loads(out[5]["content"]) == {"big": 123456789012345678901234567890}  # sent as the model wrote it


# --- concurrency, idempotency, faults: a transport that records ---------------------------------


class Recording(md.Transport):
    """Answers echo; records each call; with `barrier`, every call waits until that many run
    at once (so a run that is not concurrent fails); raises for the aid `explode`."""

    def __init__(self, barrier: int = 0, explode: str | None = None) -> None:
        super().__init__(timeout=5)
        self.barrier = threading.Barrier(barrier, timeout=5) if barrier else None
        self.explode = explode
        self.calls: list[tuple[str, Any, str | None]] = []
        self.lock = threading.Lock()

    def call(self, aid: str, inputs: Any = None, *, state: Any = None, idempotency_key: str | None = None,
             lease_token: str | None = None, timeout: float | None = None, check: bool = True,
             user: str | None = None) -> md.ToolResult:
        with self.lock:
            self.calls.append((aid, inputs, idempotency_key))
        if self.barrier is not None:
            self.barrier.wait()
        if aid == self.explode:
            raise RuntimeError("the transport broke")
        text = inputs if isinstance(inputs, str) else json.dumps(inputs, separators=(",", ":"))
        return md.ToolResult(aid, True, "OK", text, "", None, None, False, None, None, None)


ECHO_CATALOG = ToolCatalog([{"aid": "AID.ECHO.v1"}, {"aid": "AID.BOOM.v1"}])


def tool_uses(n: int, name: str = "AID-ECHO-v1") -> list[dict[str, Any]]:
    return [{"type": "tool_use", "id": f"toolu_01{i:022d}", "name": name, "input": {"i": i}} for i in range(n)]


def test_calls_run_concurrently(run: Runner) -> None:
    transport = Recording(barrier=6)  # six calls must be in flight together, or the barrier breaks
    out = run(transport, tool_uses(6), ECHO_CATALOG)
    assert [json.loads(m["content"]) for m in out] == [{"i": i} for i in range(6)]
    assert not any(m.get("is_error") for m in out)
    assert sorted(c[1]["i"] for c in transport.calls) == list(range(6))


def test_a_transport_that_raises_loses_no_call(run: Runner) -> None:
    transport = Recording(explode="AID.BOOM.v1")
    content = [*tool_uses(2), {"type": "tool_use", "id": "toolu_01boom", "name": "AID-BOOM-v1", "input": {}},
               *tool_uses(3)[2:]]
    out = run(transport, content, ECHO_CATALOG)
    assert [m["tool_use_id"] for m in out] == [b["id"] for b in content]
    assert [m.get("is_error", False) for m in out] == [False, False, True, False]
    assert error_of(out[2]["content"]) == {"kind": "exception", "code": "exception",
                                           "message": "RuntimeError: the transport broke"}


def test_idempotency_keys_from_call_ids(run: Runner) -> None:
    transport = Recording()
    run(transport, tool_uses(2), ECHO_CATALOG, idempotency_keys=True)
    run(transport, tool_uses(1), ECHO_CATALOG)
    run(transport, tool_uses(1), ECHO_CATALOG, idempotency_keys=lambda c: f"conversation-7:{c.call_id}")
    assert sorted(c[2] or "" for c in transport.calls) == [
        "", "conversation-7:toolu_010000000000000000000000",
        "toolu_010000000000000000000000", "toolu_010000000000000000000001"]


def test_a_replayed_response_does_not_write_twice(inprocess: md.InProcess, catalog: ToolCatalog,
                                                  workspace: Path) -> None:
    def append(call_id: str) -> dict[str, Any]:
        return {"id": call_id, "type": "function", "function": {
            "name": "AID-FILE-WRITE-v1", "arguments": json.dumps({"path": "log.txt", "content": "+", "append": True})}}

    message = {"role": "assistant", "content": None, "tool_calls": [append("call_log1")]}
    first = run_tool_calls(inprocess, message, catalog, idempotency_keys=True)
    again = run_tool_calls(inprocess, copy.deepcopy(message), catalog, idempotency_keys=True)
    assert first == again and json.loads(first[0]["content"])["bytes_written"] == 1
    assert (workspace / "log.txt").read_text() == "+"
    run_tool_calls(inprocess, message, catalog)  # without keys the replay writes again
    assert (workspace / "log.txt").read_text() == "++"


def test_output_shapes_that_are_refused_run_nothing() -> None:
    transport = Recording()
    mixed = [*tool_uses(1), {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "AID-ECHO-v1",
                             "arguments": "{}"}]
    with pytest.raises(ValueError, match="several APIs"):
        run_tool_calls(transport, mixed, ECHO_CATALOG)
    with pytest.raises(ValueError, match="not openai_chat"):
        run_tool_calls(transport, tool_uses(1), ECHO_CATALOG, api="openai_chat")
    with pytest.raises(ValueError, match="without its 'id'"):
        run_tool_calls(transport, [*tool_uses(1), {"type": "tool_use", "name": "AID-ECHO-v1", "input": {}}],
                       ECHO_CATALOG)
    with pytest.raises(ValueError, match="not a model output"):
        run_tool_calls(transport, {"text": "hello"}, ECHO_CATALOG)
    with pytest.raises(ValueError, match="one choice"):
        run_tool_calls(transport, {"choices": []}, ECHO_CATALOG)
    with pytest.raises(ValueError, match="unknown api"):
        asyncio.run(arun_tool_calls(transport, [], ECHO_CATALOG, api="gemini"))  # type: ignore[arg-type]
    assert transport.calls == []


def test_parse_tool_calls_and_sdk_objects() -> None:
    class Model:  # the shape of the openai/anthropic SDKs' pydantic objects
        def __init__(self, data: dict[str, Any]) -> None:
            self.data = data

        def model_dump(self) -> dict[str, Any]:
            return self.data

    calls = parse_tool_calls(Model(responses_output()))
    assert [c.call_id for c in calls][:2] == ["call_unLAR8MvFNptuiZK6K6HCy5k", "call_9bXc2Ue4Kq7WmNp0Ls3Rt6Vy"]
    assert calls[0] == ToolCall("openai_responses", "call_unLAR8MvFNptuiZK6K6HCy5k", "AID-TEXT-STATS-v1",
                                "{\"text\": \"to be or not to be\", \"top\": 1}")
    blocks = [Model(b) for b in anthropic_message()["content"]]
    assert [c.name for c in parse_tool_calls(blocks)][:2] == ["AID-FILE-READ-v1", "AID-TEXT-STATS-v1"]
    one = parse_tool_calls(chat_completion()["choices"][0]["message"]["tool_calls"][0])
    assert one == [ToolCall("openai_chat", "call_abc123", "AID-TEXT-STATS-v1",
                            "{\"text\": \"to be or not to be\"}")]
    ok = md.ToolResult("AID.ECHO.v1", True, "OK", "{}", "", None, None, False, None, None, None)
    assert one[0].result_message(ok) == {"role": "tool", "tool_call_id": "call_abc123", "content": "{}"}


# --- the guide ----------------------------------------------------------------------------------

GUIDE = REPO / "docs" / "llm-tools.md"


def guide_examples() -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    return [b for b in blocks if "import machina_dispatch" in b]


def test_the_guide_has_examples() -> None:
    assert len(guide_examples()) >= 2


@pytest.mark.parametrize("index", range(len(guide_examples())))
def test_guide_example_runs_as_documented(index: int, tmp_path: Path) -> None:
    """As tests/test_docs_examples.py reads python blocks: each print shows what its comment says."""
    from test_docs_examples import python_expected_output as expected_output

    code = guide_examples()[index]
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env=base_env({"MACHINA_TOOLHOST_WORKSPACE": str(tmp_path)}), timeout=120)
    assert proc.returncode == 0, proc.stderr
    expected = expected_output(code)
    assert expected and proc.stdout.splitlines() == expected
