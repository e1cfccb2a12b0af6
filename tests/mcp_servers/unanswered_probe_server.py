"""An MCP server, line by line without the SDK, that leaves the 2026-07-28 probe
(server/discover) unanswered in time, for the tests of a client's fallback:

- ``silent``: it never answers server/discover, and serves the handshake revisions;
- ``late``: it takes server/discover as the SDK's server does — the connection serves
  2026-07-28 from then on, so initialize is refused with -32022 naming it — but answers it
  only after ``--delay`` seconds.

One tool, ``era``, answers the revision it was called at.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from typing import Any

MODERN = "2026-07-28"
VERSION_KEY = "io.modelcontextprotocol/protocolVersion"

parser = argparse.ArgumentParser()
parser.add_argument("mode", choices=["silent", "late"])
parser.add_argument("--delay", type=float, default=1.5)
args = parser.parse_args()
lock = threading.Lock()


def write(message: dict[str, Any]) -> None:
    with lock:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def result(id: object, value: dict[str, Any]) -> None:
    write({"jsonrpc": "2.0", "id": id, "result": value})


modern = False
for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message:
        continue
    id, method, params = message["id"], message["method"], message.get("params") or {}
    enveloped = VERSION_KEY in (params.get("_meta") or {})
    if method == "server/discover":
        if args.mode == "late":
            modern = True
            answer = {"jsonrpc": "2.0", "id": id, "result": {
                "supportedVersions": [MODERN], "capabilities": {"tools": {}}, "resultType": "complete",
                "cacheScope": "private", "ttlMs": 0}}
            threading.Timer(args.delay, write, [answer]).start()
    elif method == "initialize":
        if modern:
            write({"jsonrpc": "2.0", "id": id, "error": {
                "code": -32022, "message": "connection is serving the 2026-07-28 protocol",
                "data": {"supported": [MODERN], "requested": params.get("protocolVersion")}}})
        else:
            result(id, {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                        "serverInfo": {"name": "unanswered-probe", "version": "0"}})
    elif modern != enveloped:
        write({"jsonrpc": "2.0", "id": id, "error": {"code": -32600, "message": "the other era's request"}})
    elif method == "tools/list":
        result(id, {"tools": [{"name": "era", "inputSchema": {"type": "object"}}]})
    elif method == "tools/call":
        result(id, {"content": [{"type": "text", "text": MODERN if modern else "2025-11-25"}], "isError": False})
    else:
        write({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "Method not found"}})
