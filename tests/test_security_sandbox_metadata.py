"""Sandboxed code cannot change the metadata of files outside its writable folders: the
mode (a setuid bit), the times, the owner or the extended attributes. Landlock does not
govern these system calls, so the launcher makes every mount read-only in the sandbox's
mount namespace except its writable folders. Checked through every runner that goes through
the launcher with writing restricted: shell.exec, a Python tool with no_filesystem_write, a
skill with no_filesystem_write and execute_python. Each attack also runs on a file inside
the writable folder, where it works (the test can fail)."""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from conftest import serve, skip_where_unconfinable
from jsonrpc_support import manifest, skill_env
from python_support import call, python_tool, write_pack

# Run inside the sandbox: each metadata change on PATH, named with its result ("ok" or the
# errno's name).
OPS = textwrap.dedent('''
    import errno, os

    def metadata_ops(path, mode):
        out = {}

        def fchmod():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fchmod(fd, mode)
            finally:
                os.close(fd)

        for name, op in [("chmod", lambda: os.chmod(path, mode)), ("fchmod", fchmod),
                         ("utime", lambda: os.utime(path, (0, 0))),
                         ("chown", lambda: os.chown(path, os.getuid(), os.getgid())),
                         ("setxattr", lambda: os.setxattr(path, "user.machina", b"x"))]:
            try:
                op()
                out[name] = "ok"
            except OSError as e:
                out[name] = errno.errorcode.get(e.errno, str(e.errno))
        return out
''')
OP_NAMES = {"chmod", "fchmod", "utime", "chown", "setxattr"}


def look(path: Path) -> tuple[Any, ...]:
    st = os.stat(path)
    return st.st_mode, st.st_mtime_ns, st.st_atime_ns, st.st_uid, st.st_gid, tuple(os.listxattr(path))


class Places:
    def __init__(self, tmp: Path) -> None:
        self.writable = tmp / "writable"
        self.outside = tmp / "outside"
        self.writable.mkdir()
        self.outside.mkdir()
        self.victim = self.outside / "victim"
        self.victim.write_text("unchanged\n")
        self.victim.chmod(0o644)
        self.mine = self.writable / "mine"
        self.mine.write_text("mine\n")
        self.mine.chmod(0o644)
        (self.writable / "link").symlink_to(self.victim)  # through a link in the writable folder
        self.before = look(self.victim)

    def attacks(self) -> list[tuple[str, int]]:
        return [(str(self.victim), 0o4777), (str(self.writable / "link"), 0o4777), (str(self.mine), 0o700)]

    def check(self, results: list[dict[str, str]]) -> None:
        outside, via_link, inside = results
        assert set(outside) == OP_NAMES and set(via_link) == OP_NAMES, results
        assert "ok" not in outside.values(), outside
        assert "ok" not in via_link.values(), via_link
        assert look(self.victim) == self.before
        assert inside == dict.fromkeys(OP_NAMES, "ok"), inside
        st = os.stat(self.mine)
        assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_mtime_ns == 0
        assert os.getxattr(self.mine, "user.machina") == b"x"


@pytest.fixture
def places(tmp_path: Path) -> Places:
    return Places(tmp_path)


def test_shell_exec(places: Places) -> None:
    policy = places.writable.parent / "policy.toml"
    policy.write_text('[shell]\nallow = ["python3"]\n')
    script = OPS + "import json, sys\nprint(json.dumps(metadata_ops(sys.argv[1], int(sys.argv[2]))))\n"
    requests = [{"id": i, "aid": "AID.SHELL.EXEC.v1",
                 "input_json": json.dumps({"command": "python3", "args": ["-c", script, path, str(mode)]})}
                for i, (path, mode) in enumerate(places.attacks())]
    answers = sorted(serve(requests, "--policy", str(policy), env={"MACHINA_TOOLHOST_WORKSPACE": str(places.writable)}),
                     key=lambda r: r["id"])
    skip_where_unconfinable(answers)
    outs = [json.loads(a["output_json"]) for a in answers]
    assert all(o["exit_code"] == 0 for o in outs), outs
    places.check([json.loads(o["stdout"]) for o in outs])


def test_python_tool_with_no_filesystem_write(places: Places, tmp_path: Path) -> None:
    tool = python_tool("AID.META.OPS.v1", "tools.metadata_ops:run", python=sys.executable,
                       guarantees={"no_filesystem_write": True}, filesystem_root=str(places.writable))
    pack = write_pack(tmp_path / "pack", [tool])
    (pack.parent / "tools" / "metadata_ops.py").write_text(
        OPS + "\ndef run(payload):\n    return metadata_ops(payload['path'], payload['mode'])\n")
    answers = serve([call("AID.META.OPS.v1", {"path": p, "mode": m}) for p, m in places.attacks()],
                    "--tools", str(pack), timeout=120)
    assert all(a["ok"] for a in answers), answers
    places.check([json.loads(a["output_json"]) for a in answers])
    assert "every other mount read-only" in answers[0]["trace"]["enforcement"]["no_filesystem_write"], answers[0]


SKILL = OPS + textwrap.dedent('''
    import json, sys

    for line in sys.stdin:
        m = json.loads(line)
        if "id" not in m:
            continue
        if m["method"] == "initialize":
            result = {"name": "meta", "version": "1.0.0", "tools": [
                {"name": "ops", "description": "metadata changes", "parameters": {"type": "object"}}]}
        elif m["method"] == "tools/call":
            args = m["params"]["arguments"]
            result = {"content": "", "structuredContent": metadata_ops(args["path"], args["mode"])}
        else:
            result = {}
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": result}) + "\\n")
        sys.stdout.flush()
        if m["method"] == "shutdown":
            break
''')


def test_skill_with_no_filesystem_write(places: Places, tmp_path: Path) -> None:
    script = tmp_path / "meta_skill.py"
    script.write_text(SKILL)
    m = manifest(tmp_path, [("skill", {"name": "meta", "command": [sys.executable, str(script)],
                                       "guarantees": {"no_filesystem_write": True},
                                       "filesystem_root": str(places.writable)})])
    answers = serve([{"aid": "AID.SKILL.META.OPS.v1", "input_json": json.dumps({"path": p, "mode": mode})}
                     for p, mode in places.attacks()], "--tools", str(m), env=skill_env(tmp_path), timeout=120)
    assert all(a["ok"] for a in answers), answers
    places.check([json.loads(a["output_json"]) for a in answers])


def test_execute_python(places: Places, tmp_path: Path) -> None:
    pyws = tmp_path / "pyws"
    pyws.mkdir()
    policy = tmp_path / "policy.toml"
    policy.write_text(f'[python]\nworkspaces = {json.dumps(str(pyws))}\npython = {json.dumps(sys.executable)}\n')
    outside = OPS + f"[metadata_ops(p, m) for p, m in {places.attacks()[:1]!r}]"
    # Its own folder is the writable one: the same changes on a file of its own work, and
    # through a link of its own to the victim they do not.
    own = OPS + (f"import os\nopen('mine', 'w').write('mine')\nos.symlink({str(places.victim)!r}, 'link')\n"
                 "[metadata_ops(os.path.abspath('link'), 0o4777), metadata_ops(os.path.abspath('mine'), 0o700),"
                 " os.stat('mine').st_mode]")
    answers = serve([{"id": 0, "aid": "AID.PYTHON.EXECUTE.v1", "input_json": json.dumps({"code": outside})},
                     {"id": 1, "aid": "AID.PYTHON.EXECUTE.v1", "input_json": json.dumps({"code": own})}],
                    "--policy", str(policy), env={"MACHINA_TOOLHOST_WORKSPACE": str(places.writable)}, timeout=120)
    answers.sort(key=lambda r: r["id"])
    skip_where_unconfinable(answers)
    results = [json.loads(a["output_json"]) for a in answers]
    assert all(r["success"] for r in results), results
    (outside_ops,) = results[0]["result"]
    via_link, inside, mode = results[1]["result"]
    assert set(outside_ops) == OP_NAMES and set(via_link) == OP_NAMES, results
    assert "ok" not in outside_ops.values() and "ok" not in via_link.values(), results
    assert look(places.victim) == places.before
    assert inside == dict.fromkeys(OP_NAMES, "ok") and stat.S_IMODE(mode) == 0o700, results[1]


# Run inside the sandbox, in its writable folder: each way of giving a file a set-ID bit.
SET_ID = textwrap.dedent('''
    import errno, os

    def set_id_ops():
        out = {}
        open("plain", "w").close()
        fd = os.open("plain", os.O_RDONLY)

        def create(name, mode):
            os.close(os.open(name, os.O_CREAT | os.O_WRONLY, mode))
            return oct(os.stat(name).st_mode & 0o7777)

        for name, op in [("chmod_setuid", lambda: os.chmod("plain", 0o4755)),
                         ("chmod_setgid", lambda: os.chmod("plain", 0o2755)),
                         ("fchmod_setuid", lambda: os.fchmod(fd, 0o4755)),
                         ("create_setuid", lambda: create("made", 0o4755)),
                         ("mknod_setuid", lambda: os.mknod("node", 0o100000 | 0o4755)),
                         ("chmod_plain", lambda: os.chmod("plain", 0o751))]:
            try:
                result = op()
                out[name] = result or "ok"
            except OSError as e:
                out[name] = errno.errorcode.get(e.errno, str(e.errno))
        out["mode"] = oct(os.stat("plain").st_mode & 0o7777)
        return out
''')
SET_ID_REFUSED = {"chmod_setuid": "EPERM", "chmod_setgid": "EPERM", "fchmod_setuid": "EPERM",
                  "create_setuid": "EPERM", "mknod_setuid": "EPERM", "chmod_plain": "ok", "mode": "0o751"}


def test_no_set_id_bit_even_inside_the_writable_folder(places: Places, tmp_path: Path) -> None:
    """Files the code writes belong to the host's user (root, for a host run as root): a set-ID
    bit on one would be a way into that user. Refused in every runner's walls (seccomp)."""
    policy = tmp_path / "policy.toml"
    pyws = tmp_path / "pyws"
    pyws.mkdir()
    policy.write_text(f'[shell]\nallow = ["python3"]\n[python]\nworkspaces = {json.dumps(str(pyws))}\n'
                      f'python = {json.dumps(sys.executable)}\n')
    script = SET_ID + "import json\nprint(json.dumps(set_id_ops()))\n"
    answers = sorted(serve([{"id": 0, "aid": "AID.SHELL.EXEC.v1",
                             "input_json": json.dumps({"command": "python3", "args": ["-c", script]})},
                            {"id": 1, "aid": "AID.PYTHON.EXECUTE.v1",
                             "input_json": json.dumps({"code": SET_ID + "set_id_ops()"})}],
                           "--policy", str(policy), env={"MACHINA_TOOLHOST_WORKSPACE": str(places.writable)},
                           timeout=120), key=lambda r: r["id"])
    skip_where_unconfinable(answers)
    shell = json.loads(answers[0]["output_json"])
    assert json.loads(shell["stdout"]) == SET_ID_REFUSED, shell
    python = json.loads(answers[1]["output_json"])
    assert python["result"] == SET_ID_REFUSED, python
    assert not [p for p in places.writable.rglob("*") if p.is_file() and p.stat().st_mode & 0o6000]
