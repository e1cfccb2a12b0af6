"""Tools the container runner's tests run inside the test image."""
from __future__ import annotations

import os
import socket
import subprocess
import time
from typing import Any


def greet(payload: dict[str, Any]) -> dict[str, Any]:
    return {"message": f"Hello {payload.get('name', 'there')}", "in_container": os.path.exists("/app/tools")}


def attempts(payload: dict[str, Any]) -> dict[str, Any]:
    """What the container's flags let a tool do: write a file, fork, open a socket, read a variable."""
    out: dict[str, Any] = {}
    try:
        with open("/app/written", "w") as f:
            f.write("x")
        out["write"] = "ok"
    except OSError as e:
        out["write"] = type(e).__name__
    try:
        out["subprocess"] = subprocess.run(["/usr/bin/python3", "-c", "print(1)"], capture_output=True,
                                           timeout=5).returncode
    except OSError as e:
        out["subprocess"] = type(e).__name__
    try:
        socket.create_connection(("10.255.255.1", 9), timeout=1).close()
        out["network"] = "ok"
    except OSError as e:
        out["network"] = type(e).__name__
    out["interfaces"] = sorted(name for _, name in socket.if_nameindex())
    out["env"] = {k: v for k, v in os.environ.items() if k.startswith(("PACK_", "HOST_"))}
    return out


def sleep(payload: dict[str, Any]) -> dict[str, Any]:
    time.sleep(float(payload.get("seconds", 60)))
    return {}


def refuse(payload: dict[str, Any]) -> dict[str, Any]:
    class Check:
        reason = "network_blocked"

    error = PermissionError("the tool may not reach the network")
    error.check = Check()  # type: ignore[attr-defined]
    raise error


def flood(payload: dict[str, Any]) -> dict[str, Any]:
    """Writes past any answer cap on stdout, then stays."""
    import sys
    sys.stdout.write("x" * int(payload.get("n", 3_000_000)))
    sys.stdout.flush()
    time.sleep(60)
    return {}


def shout(payload: dict[str, Any]) -> str:
    return "x" * int(payload.get("n", 10))
