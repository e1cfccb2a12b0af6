"""An MCP server on the SDK's low-level Server that lists its tools two to a page, for the
test of following tools/list cursors."""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.stdio import stdio_server

TOOLS = [types.Tool(name=f"t{i}", input_schema={"type": "object"}) for i in range(5)]


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    start = int(params.cursor) if params is not None and params.cursor else 0
    following = str(start + 2) if start + 2 < len(TOOLS) else None
    return types.ListToolsResult(tools=TOOLS[start:start + 2], next_cursor=following)


async def call_tool(ctx: Any, params: Any) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=f"called {params.name}")])


server = Server("paged", version="0.1", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


anyio.run(main)
