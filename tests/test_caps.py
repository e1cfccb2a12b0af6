"""Caps: the request cap (--run stdin, --serve line) is enforced without running
anything and without buffering much beyond the cap; the output cap is a clear error."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from conftest import SANITIZED, TOOLHOST, echo, ok_response, plain_error, run_json, serve, serve_raw, status_error

CAP = 10 * 1024 * 1024
TOO_LARGE = plain_error("request_too_large", f"request exceeds the {CAP}-byte cap")


def big_echo_line(total: int) -> bytes:
    """A valid echo request line of exactly `total` bytes (without the newline)."""
    head = b'{"aid":"AID.ECHO.v1","input_json":"\\"'
    tail = b'\\""}'
    return head + b"x" * (total - len(head) - len(tail)) + tail


def test_serve_refuses_12mb_line_then_answers_the_next() -> None:
    data = big_echo_line(12 * 1024 * 1024) + b"\n" + json.dumps(echo([1], id=2)).encode() + b"\n"
    proc = serve_raw(data)
    lines = [json.loads(x) for x in proc.stdout.splitlines()]
    assert lines == [TOO_LARGE, ok_response("[1]", id=2)]


def test_serve_line_at_the_cap_is_accepted_and_one_more_byte_is_not() -> None:
    cap = 4096
    at_cap = big_echo_line(cap)
    over = big_echo_line(cap + 1)
    proc = serve_raw(at_cap + b"\n" + over + b"\n", "--max-request-bytes", str(cap),
                     "--max-output-bytes", str(cap))
    lines = [json.loads(x) for x in proc.stdout.splitlines()]
    assert lines[0]["ok"] is True
    assert lines[0]["output_json"] == json.loads(at_cap)["input_json"]
    assert lines[1] == plain_error("request_too_large", f"request exceeds the {cap}-byte cap")


def test_oversized_last_line_without_newline() -> None:
    proc = serve_raw(big_echo_line(100) + b"\n" + big_echo_line(5000), "--max-request-bytes", "1000")
    lines = [json.loads(x) for x in proc.stdout.splitlines()]
    assert lines[0]["ok"] is True
    assert lines[1] == plain_error("request_too_large", "request exceeds the 1000-byte cap")


def _peak_rss_kib(args: list[str], payload_mib: int) -> tuple[int, bytes]:
    """Streams a `payload_mib` MiB line into machina-toolhost from a child Python process
    and reports the host's peak RSS (KiB) and its output."""
    script = textwrap.dedent(f"""
        import resource, subprocess, sys
        p = subprocess.Popen({[TOOLHOST, *args]!r}, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        chunk = b"x" * (1 << 20)
        p.stdin.write(b'{{"aid":"AID.ECHO.v1","input_json":"')
        try:
            for _ in range({payload_mib}):
                p.stdin.write(chunk)
            p.stdin.write(b'"}}\\n')
            p.stdin.close()
        except BrokenPipeError:
            pass
        out = p.stdout.read()
        p.wait()
        sys.stdout.buffer.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss).encode() + b"\\n" + out)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    rss, _, out = proc.stdout.partition(b"\n")
    return int(rss), out


@pytest.mark.parametrize("mode", [["--serve"], ["--run", "AID.ECHO.v1"]])
def test_oversized_input_is_not_buffered_whole(mode: list[str]) -> None:
    base_kib, _ = _peak_rss_kib(mode, payload_mib=0)
    rss_kib, out = _peak_rss_kib(mode, payload_mib=64)
    assert json.loads(out) == TOO_LARGE
    # 64 MiB were sent; the host holds at most the 10 MiB cap plus a read chunk more than
    # for a tiny line (under AddressSanitizer, freed buffers also wait in its 16 MiB
    # quarantine).
    allowance = (16 + (16 if SANITIZED else 0)) * 1024
    assert rss_kib - base_kib < allowance, (base_kib, rss_kib)


def test_run_refuses_12mb_stdin_without_running(tmp_path) -> None:  # type: ignore[no-untyped-def]
    body = json.dumps({"input_json": json.dumps({"path": "out.txt", "content": "x" * (12 << 20)})})
    resp = run_json("AID.FILE.WRITE.v1", body, env={"MACHINA_TOOLHOST_WORKSPACE": str(tmp_path)})
    assert resp == TOO_LARGE
    assert not (tmp_path / "out.txt").exists()


def test_output_over_the_default_cap_is_an_error(misbehaving: str) -> None:
    responses = serve([{"aid": "AID.TEST.HUGE.v1", "input_json": json.dumps({"bytes": 2 << 20})}],
                      "--plugin", misbehaving)
    assert responses == [status_error("TOOL_ERROR", "output_too_large",
                                      "tool output exceeds the 1048576-byte cap")]


def test_output_cap_is_configurable_and_exact(misbehaving: str) -> None:
    # HUGE outputs a JSON string: n characters plus two quotes.
    responses = serve([{"aid": "AID.TEST.HUGE.v1", "input_json": json.dumps({"bytes": 98})},
                       {"aid": "AID.TEST.HUGE.v1", "input_json": json.dumps({"bytes": 99})}],
                      "--plugin", misbehaving, "--max-output-bytes", "100")
    assert responses[0]["ok"] is True and len(responses[0]["output_json"]) == 100
    assert responses[1] == status_error("TOOL_ERROR", "output_too_large", "tool output exceeds the 100-byte cap")


def test_output_cap_applies_to_echo() -> None:
    responses = serve([echo("y" * 200)], "--max-output-bytes", "64")
    assert responses == [status_error("TOOL_ERROR", "output_too_large", "tool output exceeds the 64-byte cap")]
