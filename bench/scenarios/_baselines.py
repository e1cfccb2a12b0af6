"""The baselines measured beside machina-toolhost: a Python host of the same protocol, an
MCP server made with the MCP SDK, and the MCP lines the native driver sends to both."""

from __future__ import annotations

from .._support import python_cmd


def python_host(codec: str) -> list[str]:
    return python_cmd("bench.baselines.echo_host", codec)


def mcp_server() -> list[str]:
    return python_cmd("bench.baselines.mcp_echo_server")


MCP_INIT = ('R:{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
            '"capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}')


MCP_INITIALIZED = 'N:{"jsonrpc":"2.0","method":"notifications/initialized"}'


MCP_CALL = ('{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo",'
            '"arguments":{"msg":"hello","n":1}}}')
