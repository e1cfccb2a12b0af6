"""The host's tools for LLM tool calling: declarations for the OpenAI Chat Completions, OpenAI
Responses and Anthropic Messages APIs, and a model response's tool calls run over any transport.

Contract: a :class:`ToolCatalog` names every declared tool within the APIs' rules (letters,
digits, ``_`` and ``-``, at most 64 characters; :func:`tool_name`) and maps each name back to
its aid; only declared tools can be called. :func:`run_tool_calls` / :func:`arun_tool_calls`
run every call of a model's output concurrently and answer each, in the calls' order, with
that API's tool-result message; a call that cannot run (a name that maps to no tool, arguments
that are not a JSON object, a failed tool) gets an error result, never an exception that would
lose the other calls. The shapes are those recorded in the design's PROTOCOLS.md (docs/llm-tools.md).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, NamedTuple, cast

from . import _core
from ._result import ToolResult
from ._transport import Transport

__all__ = [
    "API",
    "ToolCall",
    "ToolCatalog",
    "arun_tool_calls",
    "parse_tool_calls",
    "run_tool_calls",
    "tool_name",
]

API = Literal["openai_chat", "openai_responses", "anthropic"]
APIS: tuple[API, ...] = ("openai_chat", "openai_responses", "anthropic")

#: What all three APIs accept as a tool's name.
NAME_RULE = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_NAME = 64
LIST_TIMEOUT_S = 30.0
MAX_LIST_BYTES = 16 * 1024 * 1024
MAX_SYNC_THREADS = 16


def tool_name(aid: str) -> str:
    """The name a tool is declared under: the aid with each ``.`` turned into ``-``
    (``AID.FILE.READ.v1`` -> ``AID-FILE-READ-v1``) when the aid has only letters, digits, ``_``
    and ``.`` and at most 64 characters — a one-to-one mapping, reversible without a catalog.
    Any other aid gets its characters' nearest allowed form, cut short, and ``-`` plus 12 hex
    digits of its SHA-256 (reversible through its :class:`ToolCatalog`, and by the host's
    fronts). The rule is the host's (``_core``), the one its fronts resolve names by."""
    return _names([aid])[0]


def _names(aids: Sequence[str]) -> list[str]:
    """The names of ``aids``, one each, distinct: a plain aid's fixed; a hashed one, on a
    clash, hashed again with the next salt (the host's rule, over the list in its order)."""
    names: list[str] = _core.llm_function_names([a.encode("utf-8", "surrogatepass") for a in aids])
    return names


def _parameters(tool: Mapping[str, Any]) -> dict[str, Any]:
    """The tool's input schema when it describes an object (the only kind the APIs take),
    else one that takes any object: the schema every front of the host advertises."""
    schema = tool.get("input_schema")
    try:
        text = "" if schema is None else schema if isinstance(schema, str) else json.dumps(schema)
        advertised: dict[str, Any] = json.loads(_core.advertised_input_schema(text))
    except (TypeError, ValueError):  # (not JSON; a lone surrogate, which UTF-8 cannot carry)
        advertised = json.loads(_core.advertised_input_schema(""))
    return advertised


class ToolCatalog:
    """The tools to declare to a model, each with its name in the APIs' rules.

    Args:
        tools: tool dicts as ``InProcess().host.list_tools()`` gives them, or the output of
            ``machina-toolhost --list`` (``{"ok": true, "tools": [...]}``); each needs ``aid``,
            and may have ``description`` and ``input_schema``.
        include_aliases: declare aliases too (tools with ``alias_of``, such as
            ``tools.file.read`` for ``AID.FILE.READ.v1``); by default they are left out, as
            they duplicate a declared tool.
        where: keep only the tools for which this returns true (e.g. ``lambda t: t["tier"] == 0``).
            A tool left out cannot be called through the catalog.

    Names are given over every tool of ``tools`` (those left out included), by the host's
    rule, so that each means the same tool to the host's fronts (docs/llm-tools.md).

    Raises:
        ValueError: a tool has no string ``aid``.
    """

    def __init__(self, tools: Iterable[Mapping[str, Any]] | Mapping[str, Any], *, include_aliases: bool = False,
                 where: Callable[[Mapping[str, Any]], bool] | None = None) -> None:
        if isinstance(tools, Mapping):
            tools = cast(Iterable[Mapping[str, Any]], tools["tools"])
        kept: dict[str, Mapping[str, Any]] = {}
        every: list[str] = []
        for tool in tools:
            aid = tool.get("aid")
            if not isinstance(aid, str):
                raise ValueError(f"a tool without a string aid: {tool!r}")
            every.append(aid)
            if aid in kept or (tool.get("alias_of") and not include_aliases) or (where and not where(tool)):
                continue
            kept[aid] = tool
        self._tools = tuple(kept.values())
        # Named over every tool listed, as the host names its registry's: a tool's name is
        # the one its host's fronts know it by, whichever tools this catalog leaves out.
        self._names: dict[str, str] = {}
        self._aids: dict[str, str] = {}
        for aid, name in zip(every, _names(every), strict=True):
            if aid in kept:
                self._names[aid] = name
                self._aids[name] = aid

    @classmethod
    def from_transport(cls, transport: Transport, *, include_aliases: bool = False,
                       where: Callable[[Mapping[str, Any]], bool] | None = None) -> ToolCatalog:
        """The tools a transport's host serves: ``host.list_tools()`` for :class:`InProcess`
        (and ``Mcp``/``Skill``); for :class:`Pool` and :class:`Spawn`, ``machina-toolhost
        --list`` run with their executable, options and environment; any other transport
        with a ``list_tools()`` method, its answer. Other transports: build the catalog from
        the tool list yourself.

        Raises:
            TypeError: the transport cannot list its tools.
            HostError: ``--list`` failed.
        """
        return cls(_list_tools(transport), include_aliases=include_aliases, where=where)

    @property
    def tools(self) -> tuple[Mapping[str, Any], ...]:
        """The declared tools' dicts, in the order given."""
        return self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, aid: object) -> bool:
        return aid in self._names

    def name_for(self, aid: str) -> str:
        """The name ``aid`` is declared under.

        Raises:
            KeyError: the catalog does not declare ``aid``.
        """
        return self._names[aid]

    def aid_for(self, name: str) -> str | None:
        """The aid a model's tool name stands for; ``None`` when it names no declared tool."""
        return self._aids.get(name)

    def declarations(self, api: API) -> list[dict[str, Any]]:
        """The tool declarations for ``api`` (fresh dicts, safe to change).

        Raises:
            ValueError: an unknown ``api``.
        """
        if api == "openai_chat":
            return self.openai_chat()
        if api == "openai_responses":
            return self.openai_responses()
        if api == "anthropic":
            return self.anthropic()
        raise ValueError(f"unknown api {api!r}: one of {', '.join(APIS)}")

    def openai_chat(self) -> list[dict[str, Any]]:
        """``tools`` for the Chat Completions API: ``{"type": "function", "function": {name,
        description?, parameters}}``. ``strict`` is left out (its default, false): a schema
        with optional properties does not qualify for it."""
        out = []
        for tool in self._tools:
            function: dict[str, Any] = {"name": self._names[tool["aid"]]}
            if tool.get("description"):
                function["description"] = str(tool["description"])
            function["parameters"] = _parameters(tool)
            out.append({"type": "function", "function": function})
        return out

    def openai_responses(self) -> list[dict[str, Any]]:
        """``tools`` for the Responses API: ``{"type": "function", name, description?,
        parameters, strict: false}``. ``strict`` is sent as false because the Responses API's
        reference gives true as its default, and strict mode refuses schemas with optional
        properties."""
        out = []
        for tool in self._tools:
            decl: dict[str, Any] = {"type": "function", "name": self._names[tool["aid"]]}
            if tool.get("description"):
                decl["description"] = str(tool["description"])
            decl["parameters"] = _parameters(tool)
            decl["strict"] = False
            out.append(decl)
        return out

    def anthropic(self) -> list[dict[str, Any]]:
        """``tools`` for the Messages API: ``{name, description?, input_schema}``."""
        out = []
        for tool in self._tools:
            decl: dict[str, Any] = {"name": self._names[tool["aid"]]}
            if tool.get("description"):
                decl["description"] = str(tool["description"])
            decl["input_schema"] = _parameters(tool)
            out.append(decl)
        return out


def _list_tools(transport: Transport) -> list[dict[str, Any]]:
    from .inprocess import InProcess
    from .pool import Pool
    from .spawn import Spawn

    if isinstance(transport, InProcess):
        tools: list[dict[str, Any]] = transport.host.list_tools()
        return tools
    if isinstance(transport, Pool):
        exe, *options = transport.argv
        # argv is [exe, "--serve", "--state-per-call", *options]; --list excludes --serve.
        return _run_list([exe, *(o for o in options if o not in ("--serve", "--state-per-call"))], transport.env)
    if isinstance(transport, Spawn):
        return _run_list([transport.executable, *transport.args], transport.env)
    lister = getattr(transport, "list_tools", None)
    if callable(lister):
        return list(lister())
    raise TypeError(f"{type(transport).__name__} cannot list its tools: build ToolCatalog(tools) from the tool list "
                    "(machina-toolhost --list with the same options)")


def _run_list(argv: list[str], env: dict[str, str] | None) -> list[dict[str, Any]]:
    from ._errors import HostError
    from ._process import run_once

    try:
        run = run_once([*argv, "--list"], env, b"", LIST_TIMEOUT_S, MAX_LIST_BYTES)
    except OSError as e:
        raise HostError(f"machina-toolhost cannot be started to list its tools: {e}") from e
    if run.ended != "exited" or run.exit_code != 0:
        raise HostError(f"machina-toolhost could not list its tools ({run.how}): {run.stderr_tail.strip()}")
    listing = json.loads(run.stdout)
    tools: list[dict[str, Any]] = listing["tools"]
    return tools


# --- the model's calls -------------------------------------------------------------------


class ToolCall(NamedTuple):
    """One tool call of a model's output.

    Attributes:
        api: the API whose shape it came in.
        call_id: what its result must name: ``tool_calls[].id`` (Chat), the item's ``call_id``
            (Responses), the block's ``id`` (Anthropic).
        name: the tool's name as the model gave it.
        arguments: as the model gave them: JSON text (OpenAI) or an object (Anthropic).
    """

    api: API
    call_id: str
    name: str
    arguments: Any

    def result_message(self, result: ToolResult) -> dict[str, Any]:
        """The API's answer to this call: ``{"role": "tool", tool_call_id, content}`` (Chat),
        ``{"type": "function_call_output", call_id, output}`` (Responses), ``{"type":
        "tool_result", tool_use_id, content, is_error?}`` (Anthropic). The content is the
        tool's output (JSON text) on success, else ``{"error": {kind, code, message}}`` as
        JSON text (with ``details`` when the failure has some)."""
        content = result.output_json if result.ok else error_text(result)
        if self.api == "openai_chat":
            return {"role": "tool", "tool_call_id": self.call_id, "content": content}
        if self.api == "openai_responses":
            return {"type": "function_call_output", "call_id": self.call_id, "output": content}
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": self.call_id, "content": content}
        if not result.ok:
            block["is_error"] = True
        return block


def error_text(result: ToolResult) -> str:
    """A failed result as the JSON text a model reads: kind, code (the host's, else the kind)
    and message, plus details."""
    error: dict[str, Any] = {"kind": result.kind, "code": result.code or result.kind, "message": result.error}
    if result.details:
        error["details"] = result.details
    return json.dumps({"error": error}, ensure_ascii=False, default=str)


def _plain(value: Any) -> Any:
    """SDK objects (pydantic models of the openai and anthropic packages) as plain dicts."""
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, (Mapping, list, tuple)):
        return dump()
    return value


_ITEM_API: dict[str, API] = {"function": "openai_chat", "function_call": "openai_responses", "tool_use": "anthropic"}


def _item_api(item: Any) -> API | None:
    if not isinstance(item, Mapping):
        return None
    kind = item.get("type")
    if kind == "function" or (kind is None and "function" in item):
        return "openai_chat"
    return _ITEM_API.get(kind) if isinstance(kind, str) else None


def _items(output: Any, api: API | None) -> tuple[API | None, list[Any]]:
    """The list of items (tool calls, output items, content blocks) a model's output holds,
    and the API whose shape it is (``None``: none of them is a call)."""
    output = _plain(output)
    if isinstance(output, Mapping):
        if "choices" in output:  # a whole chat completion
            choices = output["choices"]
            if not isinstance(choices, list) or len(choices) != 1:
                raise ValueError("a chat completion with other than one choice: pass the choice's message")
            return _items(_plain(choices[0])["message"], api or "openai_chat")
        if "tool_calls" in output or (output.get("role") == "assistant" and not isinstance(output.get("content"), list)
                                      and "output" not in output):
            found: API | None = "openai_chat"
            items = output.get("tool_calls") or []
        elif isinstance(output.get("output"), list):  # a whole response of the Responses API
            found, items = "openai_responses", output["output"]
        elif isinstance(output.get("content"), list):  # an Anthropic message
            found, items = "anthropic", output["content"]
        elif _item_api(output) is not None:  # one call on its own
            found, items = _item_api(output), [output]
        else:
            raise ValueError("not a model output with tool calls: expected a chat message (tool_calls), a Responses "
                             "output (output items), or an Anthropic message (content blocks)")
    elif isinstance(output, (list, tuple)):
        items = list(output)
        kinds = {k for k in map(_item_api, map(_plain, items)) if k is not None}
        if len(kinds) > 1:
            raise ValueError(f"tool calls of several APIs in one output: {', '.join(sorted(kinds))}")
        found = next(iter(kinds), None)
    else:
        raise ValueError(f"not a model output with tool calls: {type(output).__name__}")
    items = [_plain(i) for i in items]
    if api is not None and found is not None and found != api:
        raise ValueError(f"the output holds {found} tool calls, not {api}")
    return found or api, items


def parse_tool_calls(output: Any, api: API | None = None) -> list[ToolCall]:
    """The tool calls of a model's output, in order. ``output`` may be, for OpenAI Chat, the
    assistant message (``{"role": "assistant", "tool_calls": [...]}``), its ``tool_calls``
    list or the whole completion (one choice); for the Responses API the response
    (``{"output": [...]}``) or its output list (only ``function_call`` items are calls); for
    Anthropic the message (``{"content": [...]}``) or its content list (only ``tool_use``
    blocks are calls). SDK objects (with ``model_dump()``) are taken too. The API is
    recognised from the shape unless ``api`` says it.

    Raises:
        ValueError: the output has none of these shapes, mixes the APIs' calls, is not the
            ``api`` named, or a call has no id.
    """
    if api is not None and api not in APIS:
        raise ValueError(f"unknown api {api!r}: one of {', '.join(APIS)}")
    found, items = _items(output, api)
    calls = []
    for item in items:
        if found == "openai_chat":  # every item is a call (its "type" may be left out)
            if not isinstance(item, Mapping):
                raise ValueError(f"a chat tool call that is not an object: {item!r}")
            function = item.get("function")
            function = function if isinstance(function, Mapping) and item.get("type", "function") == "function" else {}
            calls.append(ToolCall("openai_chat", _call_id(item, "id"), _name(function), function.get("arguments")))
        elif _item_api(item) == found == "openai_responses":
            calls.append(ToolCall("openai_responses", _call_id(item, "call_id"), _name(item), item.get("arguments")))
        elif _item_api(item) == found == "anthropic":
            calls.append(ToolCall("anthropic", _call_id(item, "id"), _name(item), item.get("input")))
    return calls


def _call_id(item: Mapping[str, Any], key: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"a tool call without its {key!r}: {dict(item)!r}")
    return value


def _name(item: Mapping[str, Any]) -> str:
    name = item.get("name")
    return name if isinstance(name, str) else ""


def _reject_constant(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")


def _prepare(call: ToolCall, catalog: ToolCatalog) -> tuple[str, Any] | ToolResult:
    """The aid and inputs to call, or the failure that answers a call that cannot run."""
    aid = catalog.aid_for(call.name)
    if aid is None:
        detail = f"no tool named {call.name!r} is declared" if call.name else "the call names no function tool"
        return ToolResult.failure(call.name, "tool_not_found", detail, status="INVALID_PICK")
    args = call.arguments
    if call.api == "anthropic":
        if args is None:
            args = {}
        if not isinstance(args, Mapping):
            return ToolResult.failure(aid, "invalid_input", f"input must be an object, not {type(args).__name__}",
                                      status="INVALID_PICK")
        return aid, args
    if isinstance(args, Mapping):  # some OpenAI-compatible servers send an object
        return aid, args
    if args is None or (isinstance(args, str) and not args.strip()):
        return aid, "{}"
    if not isinstance(args, str):
        return ToolResult.failure(aid, "invalid_input", f"arguments must be JSON text, not {type(args).__name__}",
                                  status="INVALID_PICK")
    try:
        decoded = json.loads(args, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:  # (RecursionError: nested past the interpreter's limit)
        return ToolResult.failure(aid, "invalid_input", f"arguments are not JSON: {e}", status="INVALID_PICK")
    if not isinstance(decoded, dict):
        return ToolResult.failure(aid, "invalid_input",
                                  f"arguments must be a JSON object, not {type(decoded).__name__}",
                                  status="INVALID_PICK")
    return aid, args  # sent as the model wrote it


def _idempotency_key(call: ToolCall, keys: bool | Callable[[ToolCall], str | None]) -> str | None:
    if keys is True:
        return call.call_id
    if callable(keys):
        return keys(call)
    return None


def _call_failed(aid: str, e: BaseException) -> ToolResult:
    return ToolResult.failure(aid, "exception", f"{type(e).__name__}: {e}")


async def arun_tool_calls(transport: Transport, output: Any, catalog: ToolCatalog, *, api: API | None = None,
                          timeout: float | None = None,
                          idempotency_keys: bool | Callable[[ToolCall], str | None] = False) -> list[dict[str, Any]]:
    """Runs a model output's tool calls concurrently (``transport.acall``) and returns the
    API's tool-result messages, one per call, in the calls' order. A call whose name maps
    to no declared tool, whose arguments are not a JSON object, or whose tool fails gets an
    error result; the other calls run all the same.

    Args:
        transport: any transport.
        output: the model's output, as :func:`parse_tool_calls` takes it.
        catalog: the catalog the tools were declared from (it maps names back to aids).
        api: the output's API, if not recognised from its shape.
        timeout: each call's deadline in seconds (default: the transport's).
        idempotency_keys: ``True`` uses each call's id as its idempotency key, so that a
            model output run twice runs each tool once (the second run replays the first's
            results while the host keeps them); or a function from the :class:`ToolCall` to
            its key (``None``: none).

    Raises:
        ValueError: the output's shape (see :func:`parse_tool_calls`); nothing has run.
    """
    calls = parse_tool_calls(output, api)

    async def run(call: ToolCall) -> ToolResult:
        prepared = _prepare(call, catalog)
        if isinstance(prepared, ToolResult):
            return prepared
        aid, inputs = prepared
        try:
            return await transport.acall(aid, inputs, idempotency_key=_idempotency_key(call, idempotency_keys),
                                         timeout=timeout, check=False)
        except Exception as e:  # a transport that raises anyway must not lose the other calls
            return _call_failed(aid, e)

    results = await asyncio.gather(*(run(c) for c in calls))
    return [c.result_message(r) for c, r in zip(calls, results, strict=True)]


def run_tool_calls(transport: Transport, output: Any, catalog: ToolCatalog, *, api: API | None = None,
                   timeout: float | None = None,
                   idempotency_keys: bool | Callable[[ToolCall], str | None] = False) -> list[dict[str, Any]]:
    """:func:`arun_tool_calls` without asyncio: the calls run concurrently on threads
    (``transport.call`` is thread-safe on every transport).

    Raises:
        ValueError: the output's shape (see :func:`parse_tool_calls`); nothing has run.
    """
    calls = parse_tool_calls(output, api)

    def run(call: ToolCall) -> ToolResult:
        prepared = _prepare(call, catalog)
        if isinstance(prepared, ToolResult):
            return prepared
        aid, inputs = prepared
        try:
            return transport.call(aid, inputs, idempotency_key=_idempotency_key(call, idempotency_keys),
                                  timeout=timeout, check=False)
        except Exception as e:
            return _call_failed(aid, e)

    if len(calls) <= 1:
        results: Sequence[ToolResult] = [run(c) for c in calls]
    else:
        with ThreadPoolExecutor(max_workers=min(len(calls), MAX_SYNC_THREADS),
                                thread_name_prefix="machina-tool-call") as threads:
            results = list(threads.map(run, calls))
    return [c.result_message(r) for c, r in zip(calls, results, strict=True)]
