"""An MCP server on the official Python SDK (``mcp``), for the tests of hosting MCP servers
and of the --mcp front: tools with structured output, an error, progress and a slow tool
that says when it is cancelled (in the file $CANCEL_LOG names).

On stdio by default; ``--http PORT [--json] [--token TOKEN]`` serves it over Streamable
HTTP on 127.0.0.1:PORT at /mcp (event streams, or JSON bodies with --json; every request
must carry ``Authorization: Bearer TOKEN`` with --token)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations
from pydantic import BaseModel

server = MCPServer(name="sdk-tests", version="1.0.0")


class Sum(BaseModel):
    sum: int
    inputs: list[int]


@server.tool(title="Adder", description="Adds two integers.",
             annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True))
def add(a: int, b: int) -> Sum:
    return Sum(sum=a + b, inputs=[a, b])


@server.tool(description="Its text, reversed (plain text content).")
def reverse(text: str) -> str:
    return text[::-1]


@server.tool(description="The words of a text (a list, wrapped as {result: ...}).")
def words(text: str) -> list[str]:
    return text.split()


@server.tool(description="Always fails.")
def fail(message: str = "it failed") -> str:
    raise ValueError(message)


@server.tool(description="Sleeps, reporting progress at each of its steps.")
async def slow(seconds: float, ctx: Context, steps: int = 4) -> str:
    try:
        for i in range(steps):
            await ctx.report_progress(i + 1, steps, f"step {i + 1} of {steps}")
            await anyio.sleep(seconds / steps)
        return f"slept {seconds}"
    except anyio.get_cancelled_exc_class():
        if os.environ.get("CANCEL_LOG"):
            with open(os.environ["CANCEL_LOG"], "a", encoding="utf-8") as f:
                f.write(f"slow({seconds}) cancelled\n")
        raise


@server.tool(description="Sleeps; says when it started and ended (CLOCK_MONOTONIC nanoseconds).")
async def sleep_stamped(seconds: float) -> dict[str, int]:
    started = time.monotonic_ns()
    await anyio.sleep(seconds)
    return {"started_ns": started, "ended_ns": time.monotonic_ns()}


@server.tool(description="Writes to its stderr, then exits.")
def crash() -> str:
    sys.stderr.write("sdk-tests: exiting on purpose\n")
    sys.stderr.flush()
    os._exit(7)


@server.tool(description="The names of its environment variables.")
def env() -> dict[str, Any]:
    return {"names": sorted(os.environ)}


def serve_http(port: int, json_response: bool, token: str | None) -> None:
    import uvicorn

    app: Any = server.streamable_http_app(json_response=json_response)
    if token is not None:
        inner = app

        async def app(scope: Any, receive: Any, send: Any) -> None:
            headers = dict(scope.get("headers") or [])
            if scope["type"] == "http" and headers.get(b"authorization") != f"Bearer {token}".encode():
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"unauthorized"})
                return
            await inner(scope, receive, send)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--http":
        token = sys.argv[sys.argv.index("--token") + 1] if "--token" in sys.argv else None
        serve_http(int(sys.argv[2]), "--json" in sys.argv, token)
    else:
        server.run("stdio")
