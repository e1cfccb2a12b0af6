"""A small MCP server on stdio, with no SDK: one JSON-RPC message a line. Its one tool,
read_file, reads a UTF-8 text file beneath the folder it runs in. docs/python.md and
docs/mcp-and-skills.md host it with machina_dispatch.Mcp:

    md.Mcp(["python3", "examples/mcp_server.py"], name="files")
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path.cwd().resolve()
READ_FILE = {
    "name": "read_file",
    "description": "Reads a UTF-8 text file beneath the server's folder.",
    "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
}


def read_file(arguments: dict[str, Any]) -> dict[str, Any]:
    path = (ROOT / str(arguments.get("path", ""))).resolve()
    if not path.is_relative_to(ROOT) or not path.is_file():
        return {"content": [{"type": "text", "text": f"no such file: {arguments.get('path')}"}], "isError": True}
    text = path.read_text(encoding="utf-8")
    return {"content": [{"type": "text", "text": text}], "isError": False}


def answer(message: dict[str, Any]) -> dict[str, Any]:
    method, params = message.get("method"), message.get("params") or {}
    if method == "initialize":
        return {"protocolVersion": params.get("protocolVersion", "2025-06-18"),
                "capabilities": {"tools": {}}, "serverInfo": {"name": "example-files", "version": "1"}}
    if method == "ping":
        return {}
    if method == "tools/list":
        return {"tools": [READ_FILE]}
    if method == "tools/call" and params.get("name") == "read_file":
        return read_file(params.get("arguments") or {})
    raise LookupError(f"unknown method or tool: {method} {params.get('name', '')}".strip())


def main() -> None:
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message:  # a notification: nothing to answer
            continue
        try:
            reply = {"jsonrpc": "2.0", "id": message["id"], "result": answer(message)}
        except LookupError as e:
            reply = {"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": str(e)}}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
