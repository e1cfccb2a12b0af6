"""shell.exec's allow list holds where programs are executed, not only for the command
named: an allowed program that executes another (env, nice, stdbuf, sh -c 'exec ...',
python3 -c 'os.execv(...)') cannot run one the list does not allow, because Landlock lets
the command execute only the allowed programs and their loader. Allowed programs still run,
one through another too. The dynamic loader, which every allowed program needs, maps a
program rather than executing it: the folders programs are found in are mounted without
exec in the sandbox, so the loader cannot run a denied one either."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import elf_interpreter, serve, skip_where_unconfinable


class Shell:
    def __init__(self, tmp: Path) -> None:
        self.ws = tmp / "ws"
        self.ws.mkdir()
        self.victim = self.ws / "victim.txt"
        self.victim.write_text("still here\n")
        self.policy = tmp / "policy.toml"

    def run(self, allow: list[str], *calls: tuple[str, list[str]], subprocesses: bool = False) -> list[dict[str, Any]]:
        self.policy.write_text(f"[shell]\nallow = {json.dumps(allow)}\n"
                               f"subprocesses = {'true' if subprocesses else 'false'}\n")
        requests = [{"id": i, "aid": "AID.SHELL.EXEC.v1", "input_json": json.dumps({"command": c, "args": a})}
                    for i, (c, a) in enumerate(calls)]
        env = {"MACHINA_TOOLHOST_WORKSPACE": str(self.ws)}
        answers = sorted(serve(requests, "--policy", str(self.policy), env=env), key=lambda r: r["id"])
        skip_where_unconfinable(answers)
        assert all(a["ok"] for a in answers), answers
        return [json.loads(a["output_json"]) for a in answers]


@pytest.fixture
def shell(tmp_path: Path) -> Shell:
    return Shell(tmp_path)


LOADER = elf_interpreter("/usr/bin/env") or "/lib64/ld-linux-x86-64.so.2"

# Each runs the denied rm (on the default deny list) through an allowed program.
THROUGH = [
    ("env", ["rm", "victim.txt"]),
    ("env", [LOADER, "/usr/bin/rm", "victim.txt"]),
    ("nice", ["rm", "victim.txt"]),
    ("stdbuf", ["-o0", "rm", "victim.txt"]),
    ("sh", ["-c", "exec rm victim.txt"]),
    ("python3", ["-c", "import os, shutil; os.execv(shutil.which('rm'), ['rm', 'victim.txt'])"]),
]


@pytest.mark.parametrize(("command", "args"), THROUGH, ids=[" ".join([c, *a]) for c, a in THROUGH])
def test_an_allowed_program_cannot_execute_a_denied_one(shell: Shell, command: str, args: list[str]) -> None:
    (out,) = shell.run([command], (command, args))
    assert out["exit_code"] != 0, out
    assert shell.victim.read_text() == "still here\n"


NOT_ALLOWED = [("env", ["touch", "made.txt"]), ("nice", ["touch", "made.txt"]),
               ("stdbuf", ["-o0", "touch", "made.txt"]), ("env", [LOADER, "/usr/bin/touch", "made.txt"]),
               ("env", [LOADER, "/usr/sbin/nologin"])]


@pytest.mark.parametrize(("command", "args"), NOT_ALLOWED, ids=[" ".join([c, *a]) for c, a in NOT_ALLOWED])
def test_nor_one_that_is_merely_not_allowed(shell: Shell, command: str, args: list[str]) -> None:
    """touch is on no list: not allowed is as good as denied."""
    (out,) = shell.run([command], (command, args))
    assert out["exit_code"] != 0, out
    assert not (shell.ws / "made.txt").exists()
    assert "Permission denied" in out["stderr"] or "failed to map segment" in out["stderr"], out


def test_allowed_programs_still_run_also_through_each_other(shell: Shell) -> None:
    outs = shell.run(["env", "nice", "stdbuf", "sh", "python3", "echo", "cat"],
                     ("echo", ["hi"]), ("env", ["echo", "via env"]), ("nice", ["cat", "victim.txt"]),
                     ("stdbuf", ["-o0", "echo", "via stdbuf"]), ("sh", ["-c", "exec echo via sh"]),
                     ("python3", ["-c", "import os; os.execv('/bin/echo', ['echo', 'via execv'])"]))
    assert [o["stdout"] for o in outs] == ["hi\n", "via env\n", "still here\n", "via stdbuf\n", "via sh\n",
                                           "via execv\n"], outs
    assert all(o["exit_code"] == 0 for o in outs), outs


def test_with_subprocesses_a_child_is_held_to_the_list_too(shell: Shell) -> None:
    outs = shell.run(["sh", "echo"], ("sh", ["-c", "rm victim.txt; echo $?"]), ("sh", ["-c", "echo started | cat"]),
                     ("sh", ["-c", "echo allowed"]), subprocesses=True)
    assert outs[0]["stdout"] != "0\n" and shell.victim.exists(), outs[0]
    assert outs[1]["stdout"] == "", outs[1]  # cat is not allowed
    assert outs[2]["stdout"] == "allowed\n"


def test_a_script_runs_only_if_its_interpreter_is_allowed_too(shell: Shell) -> None:
    script = shell.ws / "hello"
    script.write_text("#!/bin/sh\necho hello from a script\n")
    script.chmod(0o755)
    shell.policy.write_text(f'[shell]\nallow = ["{script}"]\n')
    (refusal,) = serve([{"aid": "AID.SHELL.EXEC.v1", "input_json": json.dumps({"command": str(script)})}],
                       "--policy", str(shell.policy), env={"MACHINA_TOOLHOST_WORKSPACE": str(shell.ws)})
    assert refusal["code"] == "access_denied", refusal
    sh = os.path.realpath("/bin/sh")
    assert f"it is a script run by {sh}, which the allow list does not name" in refusal["error"], refusal
    (out,) = shell.run([str(script), "sh"], (str(script), []))
    assert out["stdout"] == "hello from a script\n" and out["exit_code"] == 0, out


def test_a_file_a_denied_name_also_names_is_not_executable_through_another(shell: Shell, tmp_path: Path) -> None:
    """A multi-call program (busybox), or a link (pkill is pgrep), is one file to the kernel:
    when a denied name names it, programs the command starts may not execute it by any name.
    Called directly by its allowed name it still runs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    multi = bin_dir / "multi"
    multi.write_bytes(Path("/usr/bin/touch").read_bytes())
    multi.chmod(0o755)
    (bin_dir / "rm").symlink_to(multi)
    shell.policy.write_text(f'[shell]\nallow = ["env", "multi"]\npath = ["{bin_dir}", "/usr/bin", "/bin"]\n')
    requests = [{"id": i, "aid": "AID.SHELL.EXEC.v1", "input_json": json.dumps({"command": c, "args": a})}
                for i, (c, a) in enumerate([("env", ["rm", "by-rm"]), ("env", ["multi", "by-env"]),
                                            ("multi", ["direct"])])]
    answers = sorted(serve(requests, "--policy", str(shell.policy), env={"MACHINA_TOOLHOST_WORKSPACE": str(shell.ws)}),
                     key=lambda r: r["id"])
    skip_where_unconfinable(answers)
    outs = [json.loads(a["output_json"]) for a in answers]
    assert outs[0]["exit_code"] != 0 and outs[1]["exit_code"] != 0, outs
    assert not (shell.ws / "by-rm").exists() and not (shell.ws / "by-env").exists()
    assert outs[2]["exit_code"] == 0 and (shell.ws / "direct").exists(), outs[2]
