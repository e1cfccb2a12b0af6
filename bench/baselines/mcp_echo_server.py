"""The official MCP Python SDK's stdio server with one echo tool: the baseline for
tool calls over MCP.

    python -m bench.baselines.mcp_echo_server
"""

from __future__ import annotations

try:
    from mcp.server.mcpserver import MCPServer  # mcp >= 2
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import FastMCP as MCPServer  # type: ignore[attr-defined,no-redef]

app = MCPServer("bench-echo")


@app.tool()
def echo(msg: str, n: int) -> dict[str, object]:
    """Returns its input."""
    return {"msg": msg, "n": n}


if __name__ == "__main__":
    app.run()
