"""`machina-toolhost tool_exec [PLUGIN] AID`: the command line a dispatch layer builds for
`$MACHINA_ROOT/build/machina_cli`, served as --run — so that an installation that points
machina_cli at this executable keeps its client unchanged."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import TOOLHOST, base_env


def exec_line(args: list[str], request: bytes, cwd: Path | None = None) -> tuple[int, str, str]:
    r = subprocess.run([TOOLHOST, *args], input=request, capture_output=True, env=base_env(), timeout=60, cwd=cwd)
    return r.returncode, r.stdout.decode(), r.stderr.decode()


def test_tool_exec_is_run() -> None:
    rc, out, _ = exec_line(["tool_exec", "AID.TEXT.STATS.v1"], b'{"input_json": "{\\"text\\": \\"a b a\\"}"}\n')
    assert rc == 0
    assert json.loads(json.loads(out)["output_json"])["words"] == 3
    rc, out, _ = exec_line(["tool_exec", "AID.ECHO.v1", "--max-timeout-ms", "5000"], b'{"inputs": {"x": 1}}')
    assert rc == 0 and json.loads(out)["output_json"] == '{"x": 1}'  # as written


def test_tool_exec_loads_a_plugin_named_before_the_aid(misbehaving: str) -> None:
    rc, out, _ = exec_line(["tool_exec", misbehaving, "AID.TEST.FAIL.v1"], b"{}")
    assert rc == 0 and json.loads(out)["error"] == "the tool said no"


def test_the_dispatch_layers_own_call_through_a_machina_cli_link(tmp_path: Path) -> None:
    # As the client does it: $MACHINA_ROOT/build/machina_cli tool_exec AID, run in
    # $MACHINA_ROOT, its request and a newline on stdin, the first line of stdout read.
    build = tmp_path / "build"
    build.mkdir()
    (build / "machina_cli").symlink_to(TOOLHOST)
    request = json.dumps({"input_json": json.dumps({"q": "test"}), "ds_state": {"slots": {}}}) + "\n"
    r = subprocess.run([str(build / "machina_cli"), "tool_exec", "AID.ECHO.v1"], input=request.encode(),
                       capture_output=True, env=base_env(), timeout=60, cwd=tmp_path)
    answer = json.loads(r.stdout.decode().splitlines()[0])
    assert r.returncode == 0 and answer["status"] == "OK" and answer["output_json"] == '{"q": "test"}'


def test_tool_exec_takes_one_aid_and_no_other_mode() -> None:
    rc, _, err = exec_line(["tool_exec"], b"{}")
    assert rc == 2 and "aid is required" in err
    rc, _, err = exec_line(["tool_exec", "AID.ECHO.v1", "--serve"], b"{}")
    assert rc == 2 and "tool_exec runs one call, as --run" in err
