"""A skill (the skill protocol, docs/specifications.md) with one tool, `sleep`, that sleeps
`ms` milliseconds on a thread of its own per request: the skill of the benchmark of many
calls in flight on one skill process.

    python -m bench.baselines.sleep_skill
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

LOCK = threading.Lock()


def answer(message: dict[str, Any], result: Any) -> None:
    with LOCK:
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}) + "\n")
        sys.stdout.flush()


def call(message: dict[str, Any]) -> None:
    time.sleep(message["params"]["arguments"].get("ms", 10) / 1000)
    answer(message, {"content": "slept"})


def main() -> None:
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message or "method" not in message:
            continue
        method = message["method"]
        if method == "tools/call":
            threading.Thread(target=call, args=(message,), daemon=True).start()
        elif method == "initialize":
            answer(message, {"name": "sleeper", "version": "1", "tools": [
                {"name": "sleep", "description": "sleeps", "parameters": {"type": "object"}}]})
        else:
            answer(message, {"ok": True})
            if method == "shutdown":
                return


if __name__ == "__main__":
    main()
