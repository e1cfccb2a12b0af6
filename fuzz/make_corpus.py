"""Writes the seed corpora for the fuzz targets: every request line of the protocol
transcripts (tests/transcripts), their ds_state objects, the responses they expect, and
— when the test suite is importable — the bad-input corpus of tests/test_bad_input.py.

    python fuzz/make_corpus.py OUT_DIR
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def write(folder: Path, data: bytes) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / hashlib.sha1(data).hexdigest()).write_bytes(data)


def frame_string(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def main(out: Path) -> int:
    requests: list[bytes] = []
    for path in sorted((REPO / "tests" / "transcripts").glob("*.ndjson")):
        for raw in path.read_bytes().splitlines():
            if not raw.strip():
                continue
            entry = json.loads(raw)
            request = entry.get("request")
            if isinstance(request, str):
                requests.append(request.encode())
            elif isinstance(request, dict):
                requests.append(json.dumps(request).encode())
                if isinstance(request.get("ds_state"), dict):
                    write(out / "ds_state", json.dumps(request["ds_state"]).encode())
            if isinstance(entry.get("response"), dict):
                write(out / "response", json.dumps(entry["response"]).encode())
    try:
        sys.path.insert(0, str(REPO / "tests"))
        from test_bad_input import RUN_CASES, SERVE_CASES  # noqa: PLC0415

        requests += [c.request for c in (*SERVE_CASES, *RUN_CASES) if len(c.request) < 100_000]
    except Exception as e:  # the package is not installed: the transcripts are enough
        print(f"(bad-input corpus skipped: {e})", file=sys.stderr)
    for r in requests:
        write(out / "request", r)
    # Worker frames: a call and a result as the host and a worker write them.
    call = frame_string(b"AID.ECHO.v1") + frame_string(b'{"a":1}') + b"\x01" + frame_string(b"t") + \
        frame_string(b"1") + frame_string(b"p") + struct.pack("<Q", 1)
    result = struct.pack("<iB", 0, 1) + frame_string(b"[1]") + frame_string(b"") + b"\x00\x00"
    write(out / "worker_frames", call)
    write(out / "worker_frames", result)
    # Tool protocol v1 answers, as workers and services write them.
    for answer in ('{"ok":true,"protocol_version":1,"result":{"message":"Hello Ada"},"trace":{"stdout":"x"}}',
                   '{"ok":false,"protocol_version":1,"error":{"type":"ValueError","message":"Missing input",'
                   '"reason_code":"guarantee_blocked"}}',
                   '{"ok":true,"result":[1,2.5,"\\u00e9",null,true]}', '{"ok":false,"error":"bare"}', '{"result":1}'):
        write(out / "tool_answer", answer.encode())
    # JSON-RPC lines, as MCP clients, skills and servers write them.
    for line in ('{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25",'
                 '"capabilities":{},"clientInfo":{"name":"c","version":"1"}}}',
                 '{"jsonrpc":"2.0","method":"notifications/initialized"}',
                 '{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"AID.ECHO.v1","arguments":{"x":[1]},'
                 '"_meta":{"progressToken":3,"machina/timeout_ms":50}}}',
                 '{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"x"}}',
                 '{"jsonrpc":"2.0","id":2,"result":{"content":[{"type":"text","text":"t"}],"structuredContent":{}}}',
                 '{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error","data":{"a":1}}}',
                 '[{"jsonrpc":"2.0","id":1,"method":"ping"}]', '{"jsonrpc":"1.0","id":1.5,"method":5}'):
        write(out / "jsonrpc", line.encode())
    counts = {d.name: len(list(d.iterdir())) for d in sorted(out.iterdir())}
    print("seed corpus:", counts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1])))
