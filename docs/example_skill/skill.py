"""notebook: an example skill, speaking the skill protocol (see SKILL.md).

Requests are read on the main thread and each call runs on a thread of its own, so that a
slow call does not hold up the others; answers are written whole, one line at a time. The
skill's own requests to the host (data/write, data/read, state/set) are matched to their
answers by id.
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
from typing import Any

WRITE = threading.Lock()
ASKED: dict[str, list[Any]] = {}  # id of a request to the host -> [answered, answer]
IDS = itertools.count(1)

TOOLS = [
    {"name": "note_write", "description": "Keeps a note under a name.",
     "parameters": {"type": "object", "properties": {"name": {"type": "string"}, "text": {"type": "string"}},
                    "required": ["name", "text"]}},
    {"name": "note_read", "description": "A note kept under a name.",
     "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
    {"name": "remember", "description": "Puts a text into a ds_state slot of the calling session.",
     "parameters": {"type": "object", "properties": {"slot": {"type": "integer", "minimum": 0, "maximum": 7},
                                                     "text": {"type": "string"}},
                    "required": ["slot", "text"]}},
    {"name": "count_words", "description": "Counts the words of a text (after delay_ms, if given).",
     "parameters": {"type": "object", "properties": {"text": {"type": "string"},
                                                     "delay_ms": {"type": "integer", "minimum": 0}},
                    "required": ["text"]}},
]


class Refused(Exception):
    """A call this skill cannot answer: a JSON-RPC error for its caller."""


def send(message: dict[str, Any]) -> None:
    with WRITE:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def ask_host(method: str, params: dict[str, Any]) -> Any:
    """A request to the host; its result, or Refused with the host's error."""
    rid = f"n{next(IDS)}"
    answered = threading.Event()
    ASKED[rid] = [answered, None]
    send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
    if not answered.wait(10):
        ASKED.pop(rid, None)
        raise Refused(f"the host did not answer {method}")
    answer = ASKED.pop(rid)[1]
    if "error" in answer:
        raise Refused(f"{method}: {answer['error']['message']}")
    return answer["result"]


def note_path(name: str) -> str:
    if not name or "/" in name or name.startswith("."):
        raise Refused(f"not a note name: {name!r}")
    return f"notes/{name}.txt"


def run_tool(name: str, args: dict[str, Any], call_id: Any) -> dict[str, Any]:
    if name == "note_write":
        ask_host("data/write", {"path": note_path(args["name"]), "content": args["text"]})
        return {"content": f"kept {args['name']}"}
    if name == "note_read":
        found = ask_host("data/read", {"path": note_path(args["name"])})
        if not found.get("exists"):
            return {"content": [{"type": "text", "text": f"no note named {args['name']}"}], "isError": True}
        return {"content": found["content"]}
    if name == "remember":
        ask_host("state/set", {"slot": args["slot"], "type": "note", "content": args["text"],
                               "provenance": "notebook", "callId": call_id})
        return {"content": f"remembered in DS{args['slot']}"}
    if name == "count_words":
        time.sleep(args.get("delay_ms", 0) / 1000)
        words = args["text"].split()
        return {"content": f"{len(words)} words", "structuredContent": {"words": len(words)}}
    raise Refused(f"no tool named {name}")


def answer_request(message: dict[str, Any]) -> None:
    method, params = message["method"], message.get("params") or {}
    try:
        if method == "initialize":
            result: Any = {"name": "notebook", "description": "notes and word counts", "version": "1.0.0",
                           "tools": TOOLS}
        elif method == "tools/call":
            result = run_tool(params["name"], params.get("arguments") or {}, message["id"])
        elif method.startswith("lifecycle/") or method == "shutdown":
            result = {"ok": True}
        elif method == "ping":
            result = {}
        else:
            send({"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": "Method not found"}})
            return
        send({"jsonrpc": "2.0", "id": message["id"], "result": result})
    except (Refused, KeyError) as e:
        send({"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32603, "message": str(e)}})


def main() -> None:
    running: list[threading.Thread] = []
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        if "method" not in message:  # the host's answer to one of our requests
            waiting = ASKED.get(message.get("id"))
            if waiting is not None:
                waiting[1] = message
                waiting[0].set()
        elif "id" not in message:  # a notification (notifications/cancelled ...): nothing to do
            continue
        elif message["method"] == "shutdown":
            for call in running:  # the calls under way are answered first
                call.join()
            answer_request(message)
            return
        else:
            running = [t for t in running if t.is_alive()]
            call = threading.Thread(target=answer_request, args=(message,), daemon=True)
            call.start()
            running.append(call)


if __name__ == "__main__":
    main()
