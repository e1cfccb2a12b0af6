"""What execute_python's code may leave in its folder is capped ([python] folder_quota_mb):
no file may grow past the quota (RLIMIT_FSIZE), and the sandbox's init, which measures the
writable folders while the code runs, kills code whose folder grows past it, with an error
that says so. The host keeps serving, and the disk it needs is not filled."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import TOOLHOST, base_env, serve, skip_where_unconfinable

EXECUTE = "AID.PYTHON.EXECUTE.v1"


def run(tmp_path: Path, quota: int | None, *codes: tuple[str, str | None]) -> list[dict[str, Any]]:
    pyws = tmp_path / "pyws"
    pyws.mkdir(exist_ok=True)
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    policy = tmp_path / "policy.toml"
    policy.write_text(f"[python]\nworkspaces = {json.dumps(str(pyws))}\npython = {json.dumps(sys.executable)}\n" +
                      (f"folder_quota_mb = {quota}\n" if quota is not None else ""))
    requests = []
    for i, (code, session) in enumerate(codes):
        inputs: dict[str, Any] = {"code": code}
        if session is not None:
            inputs["session_id"] = session
        requests.append({"id": i, "aid": EXECUTE, "input_json": json.dumps(inputs)})
    answers = sorted(serve(requests, "--policy", str(policy), env={"MACHINA_TOOLHOST_WORKSPACE": str(ws)},
                           timeout=120), key=lambda r: r["id"])
    skip_where_unconfinable(answers)
    return answers


FILL = ("import os, time\nfor i in range(16):\n"
        "    open(f'fill{i}', 'wb').write(os.urandom(1 << 20))\n    time.sleep(0.01)\n")


def test_code_filling_its_folder_past_the_quota_is_stopped(tmp_path: Path) -> None:
    answers = run(tmp_path, 8, (FILL, "s"), ("open('big', 'wb').write(b'z' * (9 << 20))", None),
                  ("open('ok', 'wb').write(b'z' * (1 << 20))", None), ("'still serving'", None))
    text = json.dumps(answers[0])
    assert "quota of 8 MiB" in text, answers[0]
    # One file past the quota stops at it (RLIMIT_FSIZE: "File too large"); the init, which
    # measures the folder (its blocks, the file system's own included) while the code runs,
    # may see it there first and kill the code: either way the call fails and nothing grows on.
    one_file = json.loads(answers[1]["output_json"])
    assert one_file["success"] is False, one_file
    assert "File too large" in one_file["error"] or "quota of 8 MiB" in one_file["error"], one_file
    assert json.loads(answers[2]["output_json"])["result"] == 1 << 20
    assert json.loads(answers[3]["output_json"])["result"] == "still serving"
    held = sum(p.stat().st_blocks * 512 for p in (tmp_path / "pyws").rglob("fill*"))
    assert held < 16 << 20


def test_the_default_quota_leaves_room_to_work(tmp_path: Path) -> None:
    (answer,) = run(tmp_path, None, (FILL + "len(os.listdir('.'))", None))
    assert json.loads(answer["output_json"])["success"] is True, answer


@pytest.mark.parametrize("value", ["-1", "2000000", "'big'"])
def test_a_bad_quota_stops_the_host(tmp_path: Path, value: str) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(f"[python]\nfolder_quota_mb = {value}\n")
    proc = subprocess.run([TOOLHOST, "--policy", str(policy), "--serve"], input=b"", capture_output=True,
                          env=base_env(), timeout=30)
    assert proc.returncode == 2 and b"field 'folder_quota_mb'" in proc.stderr, proc.stderr
