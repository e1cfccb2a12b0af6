"""The tests' skill (the skill protocol: JSON-RPC 2.0 on stdio, one message a line).

Each request is handled on a thread of its own, so many calls run at once; requests of the
skill's own to the host (state/*, data/*) are matched by id. Everything the host sends that
is not a call (lifecycle methods, notifications) is logged to probe.log beside this file,
one JSON object a line, for the tests to read.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import sys
import threading
import time
from typing import Any

LOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe.log")
OUT_LOCK = threading.Lock()
LOG_LOCK = threading.Lock()
PENDING: dict[str, list[Any]] = {}  # id -> [event, answer]
COUNTER = iter(range(1, 1 << 62))
HUNG = threading.Event()


class RpcError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def send(message: dict[str, Any]) -> None:
    with OUT_LOCK:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def log(event: str, **fields: Any) -> None:
    with LOG_LOCK, open(LOG, "a", encoding="utf-8") as f:
        f.write(json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n")


def ask(method: str, params: dict[str, Any], raw_method: bytes | None = None) -> Any:
    """A request to the host; its whole answer (result or error). With `raw_method`, the
    method name is written as these bytes (which need not be UTF-8)."""
    rid = f"s{next(COUNTER)}"
    done = threading.Event()
    PENDING[rid] = [done, None]
    if raw_method is None:
        send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
    else:
        with OUT_LOCK:
            sys.stdout.flush()
            sys.stdout.buffer.write(b'{"jsonrpc":"2.0","id":"' + rid.encode() + b'","method":"' + raw_method +
                                    b'","params":' + json.dumps(params).encode() + b"}\n")
            sys.stdout.buffer.flush()
    if not done.wait(10):
        return {"no_answer": True}
    return PENDING.pop(rid)[1]


def schema(**props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props}


TOOLS = [
    {"name": "echo", "description": "Its arguments, as text (the skill protocol's content string)",
     "parameters": schema(text={"type": "string"})},
    {"name": "blocks", "description": "Two text blocks", "parameters": schema()},
    {"name": "structured", "description": "Structured content",
     "parameters": schema(n={"type": "integer"})},
    {"name": "sleep", "description": "Sleeps ms milliseconds (with stamps: when it started and ended)",
     "parameters": schema(ms={"type": "integer"}, stamps={"type": "boolean"})},
    {"name": "fail", "description": "Answers a JSON-RPC error", "parameters": schema(message={"type": "string"})},
    {"name": "is_error", "description": "Answers isError", "parameters": schema()},
    {"name": "crash", "description": "Exits at once", "parameters": schema()},
    {"name": "hang", "description": "Stops reading and answering", "parameters": schema()},
    {"name": "garbage", "description": "Writes a line that is not JSON", "parameters": schema()},
    {"name": "state", "description": "Reads a ds_state slot and writes another",
     "parameters": schema(slot={"type": "integer"}, put={"type": "integer"})},
    {"name": "data", "description": "Writes a file of its data directory and reads it back",
     "parameters": schema(path={"type": "string"}, content={"type": "string"})},
    {"name": "ask", "description": "Sends the host any request (method_hex: a method name's raw bytes)",
     "parameters": schema(method={"type": "string"}, params={"type": "object"}, method_hex={"type": "string"})},
    {"name": "progress", "description": "Reports progress steps, then answers",
     "parameters": schema(steps={"type": "integer"})},
    {"name": "env", "description": "Its environment's names", "parameters": schema()},
    {"name": "net", "description": "Whether it may open a socket", "parameters": schema()},
    {"name": "big", "description": "A text of n bytes", "parameters": schema(n={"type": "integer"})},
    {"name": "deep", "description": "Answers with a result nested n deep (a raw line)",
     "parameters": schema(n={"type": "integer"})},
    {"name": "limits", "description": "Its resource limits (soft)", "parameters": schema()},
]


def call(name: str, args: dict[str, Any], meta: dict[str, Any], call_id: Any) -> dict[str, Any]:
    if name == "echo":
        return {"content": json.dumps(args, sort_keys=True)}
    if name == "blocks":
        return {"content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}
    if name == "structured":
        return {"content": [{"type": "text", "text": "n"}], "structuredContent": {"n": args.get("n", 0)}}
    if name == "sleep":
        started = time.monotonic_ns()
        time.sleep(args.get("ms", 10) / 1000)
        if args.get("stamps"):
            return {"content": "slept", "structuredContent": {"started_ns": started, "ended_ns": time.monotonic_ns()}}
        return {"content": "slept"}
    if name == "fail":
        raise RpcError(-32603, args.get("message", "it failed"))
    if name == "is_error":
        return {"content": [{"type": "text", "text": "it went wrong"}], "isError": True}
    if name == "crash":
        sys.stderr.write("probe: crashing on purpose\n")
        sys.stderr.flush()
        os._exit(3)
    if name == "hang":
        HUNG.set()
        time.sleep(3600)
    if name == "garbage":
        with OUT_LOCK:
            sys.stdout.write("this is not JSON-RPC\n")
            sys.stdout.flush()
        return {"content": "?"}
    if name == "state":
        got = ask("state/get", {"slot": args.get("slot", 0), "callId": call_id})
        put = ask("state/set", {"slot": args.get("put", 1), "type": "probe", "content": {"seen": got},
                                "callId": call_id})
        return {"content": "", "structuredContent": {"get": got, "set": put}}
    if name == "data":
        wrote = ask("data/write", {"path": args["path"], "content": args.get("content", "")})
        read = ask("data/read", {"path": args["path"]})
        return {"content": "", "structuredContent": {"write": wrote, "read": read}}
    if name == "ask":
        raw = bytes.fromhex(args["method_hex"]) if "method_hex" in args else None
        return {"content": "", "structuredContent": ask(args.get("method", ""), args.get("params", {}), raw)}
    if name == "progress":
        steps = args.get("steps", 3)
        for i in range(steps):
            send({"jsonrpc": "2.0", "method": "notifications/progress",
                  "params": {"progressToken": meta.get("progressToken"), "progress": i + 1, "total": steps,
                             "message": f"step {i + 1}"}})
            time.sleep(0.01)
        return {"content": "done"}
    if name == "env":
        return {"content": "", "structuredContent": {"names": sorted(os.environ)}}
    if name == "net":
        try:
            socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
            return {"content": "allowed"}
        except OSError as e:
            return {"content": f"refused: {e}"}
    if name == "limits":
        return {"content": "", "structuredContent": {
            name: resource.getrlimit(getattr(resource, "RLIMIT_" + name.upper()))[0]
            for name in ("nofile", "as", "fsize")}}
    if name == "big":
        return {"content": "x" * args.get("n", 10)}
    if name == "deep":  # (json.dumps cannot nest this deep: the line is written as bytes)
        n = args.get("n", 100_000)
        with OUT_LOCK:
            sys.stdout.buffer.write(b'{"jsonrpc":"2.0","id":' + json.dumps(call_id).encode() + b',"result":' +
                                    b"[" * n + b"]" * n + b"}\n")
            sys.stdout.flush()
        return {"content": "?"}
    raise RpcError(-32602, f"no tool {name}")


def handle(message: dict[str, Any]) -> None:
    method, rid, params = message["method"], message["id"], message.get("params") or {}
    try:
        if method == "initialize":
            result: Any = {"name": "probe", "description": "the tests' skill", "version": "1.0.0", "tools": TOOLS}
        elif method == "tools/call":
            result = call(params["name"], params.get("arguments") or {}, params.get("_meta") or {}, rid)
        elif method.startswith(("lifecycle/", "skill/")) or method == "shutdown":
            log(method, params=params)
            result = {"ok": True}
        elif method == "ping":
            result = {}
        else:
            raise RpcError(-32601, "Method not found")
        send({"jsonrpc": "2.0", "id": rid, "result": result})
    except RpcError as e:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": e.code, "message": str(e)}})


def main() -> None:
    log("started", argv=sys.argv, cwd=os.getcwd())
    for line in sys.stdin:
        if HUNG.is_set():
            time.sleep(3600)
        message = json.loads(line)
        if "method" not in message:  # an answer to one of ours
            slot = PENDING.get(message.get("id"))
            if slot is not None:
                slot[1] = message
                slot[0].set()
            continue
        if "id" not in message:
            log(message["method"], params=message.get("params"))
            continue
        if message["method"] == "shutdown":
            handle(message)
            break
        threading.Thread(target=handle, args=(message,), daemon=True).start()
    log("exiting")


if __name__ == "__main__":
    main()
