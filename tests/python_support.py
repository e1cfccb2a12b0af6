"""Helpers for the Python tool tests: a tool pack (the test tools and a manifest) written
into a test's folder, and requests for its tools."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import textwrap
import zipfile
from pathlib import Path
from typing import Any

TOOLS_SRC = Path(__file__).resolve().parent / "python_tools" / "tools"

# Tool protocol v1's local runner as its documents describe it (one interpreter per call, request on
# stdin, the tool's output captured and dropped, one JSON object out), written here
# independently of ours.
LITERAL_RUNNER = textwrap.dedent('''
    import contextlib, decimal, importlib, io, json, sys
    def default(v):
        if isinstance(v, decimal.Decimal):
            return int(v) if v == v.to_integral_value() else str(v.normalize())
        raise TypeError(type(v).__name__)
    req = json.loads(sys.stdin.read())
    sys.path.insert(0, ".")
    try:
        mod_name, fn_name = req["entry"].split(":")
        target = importlib.import_module(mod_name)
        for part in fn_name.split("."):
            target = getattr(target, part)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            result = target(req.get("payload", {}))
        out = {"ok": True, "protocol_version": 1, "result": result}
    except Exception as e:
        err = {"type": type(e).__name__, "message": str(e)}
        if getattr(e, "reason_code", None):
            err["reason_code"] = e.reason_code
        out = {"ok": False, "protocol_version": 1, "error": err}
    sys.stdout.write(json.dumps(out, default=default))
''')


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(type(v).__name__)


def manifest_text(tools: list[dict[str, Any]]) -> str:
    out = []
    for t in tools:
        out.append("[[tool]]")
        out.extend(f"{k} = {toml_value(v)}" for k, v in t.items())
        out.append("")
    return "\n".join(out)


def python_tool(aid: str, entry: str, **fields: Any) -> dict[str, Any]:
    return {"aid": aid, "runner": "python", "entry": entry, **fields}


def write_pack(folder: Path, tools: list[dict[str, Any]], name: str = "tools.toml") -> Path:
    """The test tools copied into `folder` (modules resolve from the manifest's folder) and a
    manifest declaring `tools`; returns the manifest's path."""
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "tools").exists():
        shutil.copytree(TOOLS_SRC, folder / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    path = folder / name
    path.write_text(manifest_text(tools))
    return path


def call(aid: str, payload: Any = None, **fields: Any) -> dict[str, Any]:
    req: dict[str, Any] = {"aid": aid}
    if payload is not None:
        req["input_json"] = json.dumps(payload)
    req.update(fields)
    return req


def make_wheel(folder: Path, name: str, version: str, files: dict[str, str], requires: tuple[str, ...] = ()) -> Path:
    """A pure-Python wheel written directly (a zip with its METADATA, WHEEL and RECORD)."""
    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    content = {**{p: t.encode() for p, t in files.items()}, f"{info}/METADATA": meta.encode(),
               f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}

    def digest(data: bytes) -> str:
        return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    record = "".join(f"{p},{digest(d)},{len(d)}\n" for p, d in content.items()) + f"{info}/RECORD,,\n"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, d in content.items():
            z.writestr(p, d)
        z.writestr(f"{info}/RECORD", record)
    return path
