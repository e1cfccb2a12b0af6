"""An MCP server on the SDK's low-level Server that writes down, for every request it gets,
the method and the protocol revision it was served at (one JSON line each in the file
$ERA_LOG names), for the tests of which revision a client speaks to it.

By default it serves as the SDK's stdio server does: the handshake revisions and 2026-07-28,
the client's first request choosing. With ``--handshake-only`` it serves the handshake
revisions alone (the SDK's handshake-only loop), as a server written before 2026-07-28 does.

Tools: ``add``; ``era`` answers the revision it was called at; ``ask`` answers, at 2026-07-28,
a result that is not complete (``input_required``: it asks its client for more).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.runner import serve_loop
from mcp.server.stdio import stdio_server

PROTOCOL_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"


async def record(ctx: Any, call_next: Any) -> Any:
    """Middleware: one line per request, before it is served (a refused one included)."""
    if ctx.request_id is not None and os.environ.get("ERA_LOG"):
        enveloped = isinstance(ctx.params, dict) and isinstance(ctx.params.get("_meta"), dict) and \
            PROTOCOL_VERSION_KEY in ctx.params["_meta"]
        with open(os.environ["ERA_LOG"], "a", encoding="utf-8") as f:
            f.write(json.dumps({"method": ctx.method, "version": ctx.protocol_version,
                                "enveloped": enveloped}) + "\n")
    return await call_next(ctx)


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[
        types.Tool(name="add", input_schema={"type": "object", "properties": {"a": {"type": "integer"},
                                                                              "b": {"type": "integer"}}}),
        types.Tool(name="era", input_schema={"type": "object"}),
        types.Tool(name="ask", input_schema={"type": "object"}),
    ])


async def call_tool(ctx: Any, params: Any) -> types.CallToolResult:
    args = params.arguments or {}
    if params.name == "add":
        total = args["a"] + args["b"]
        return types.CallToolResult(content=[types.TextContent(type="text", text=str(total))],
                                    structured_content={"sum": total})
    if params.name == "era":
        return types.CallToolResult(content=[types.TextContent(type="text", text=ctx.protocol_version)])
    if params.name == "ask":  # (2026-07-28: the client is asked for more before the call completes)
        return {"resultType": "input_required", "requestState": "asked-once"}  # type: ignore[return-value]
    return types.CallToolResult(content=[types.TextContent(type="text", text=f"no tool {params.name}")],
                                is_error=True)


server = Server("era", version="0.1", on_list_tools=list_tools, on_call_tool=call_tool)
server.middleware.append(record)


async def main() -> None:
    async with stdio_server() as (read, write):
        if "--handshake-only" in sys.argv[1:]:
            async with server.lifespan(server) as state:
                await serve_loop(server, read, write, lifespan_state=state,
                                 init_options=server.create_initialization_options())
        else:
            await server.run(read, write, server.create_initialization_options())


anyio.run(main)
