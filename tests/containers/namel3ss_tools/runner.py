"""Tool protocol v1 inside a container: one call object on stdin, one answer on stdout.

The container runner's default command (`python -m namel3ss_tools.runner`) runs this module in
the test image: it imports the call's `entry` (`module:function`) and calls it with the
payload. An exception is answered as the protocol's error, with `reason_code` from an
exception's `.check.reason` when it has one.
"""
from __future__ import annotations

import importlib
import json
import sys


def main() -> int:
    call = json.loads(sys.stdin.read())
    module_name, function_name = call["entry"].split(":", 1)
    try:
        function = getattr(importlib.import_module(module_name), function_name)
        answer = {"ok": True, "result": function(call["payload"])}
    except Exception as exc:  # every failure of the tool is its answer
        error = {"type": type(exc).__name__, "message": str(exc)}
        reason = getattr(getattr(exc, "check", None), "reason", None)
        if reason:
            error["reason_code"] = reason
        answer = {"ok": False, "error": error}
    sys.stdout.write(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
