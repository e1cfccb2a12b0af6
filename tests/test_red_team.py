"""The red team's attacks on every tool of the packs, through --serve with one policy that
turns everything on: path escapes, a folder swapped for a link while calls run, injection
through arguments, the lease secret and the audit store as targets, resource exhaustion,
fork bombs and the network from any code that runs. Each attack gets its refusal (or
finds nothing), nothing outside the roots changes, and the host keeps serving.

(Deeper tests of single tools live beside them: tests/test_security_files.py,
tests/test_tool_packs.py, tests/test_code_search.py, tests/test_python_exec.py,
tests/test_audit.py.)"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import process_tree
import pytest
from conftest import LEASE_SECRET, scaled, serve, skip_where_unconfinable
from test_tool_packs import snapshot

READ, WRITE, DELETE, LIST = "AID.FILE.READ.v1", "AID.FILE.WRITE.v1", "AID.FILE.DELETE.v1", "AID.FILE.LIST.v1"
EXEC, GREP, SEARCH = "AID.SHELL.EXEC.v1", "AID.CODE.GREP.v1", "AID.CODE.SEARCH.v1"
PYTHON = "AID.PYTHON.EXECUTE.v1"


class Lab:
    """A workspace (the only root), an outside folder holding a secret, a lease key file and
    an audit store outside the root, and a policy that turns every pack on."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.ws = tmp / "ws"
        self.outside = tmp / "outside"
        self.keys = tmp / "keys"
        self.audit = tmp / "audit" / "calls.db"
        for d in (self.ws, self.outside, self.keys, self.audit.parent, tmp / "pyws", tmp / "index"):
            d.mkdir()
        (self.outside / "secret.txt").write_text("outside secret ZEBRA\n")
        (self.ws / "notes.txt").write_text("hello notes\n")
        self.key = self.keys / "lease.key"
        self.key.write_text(LEASE_SECRET)
        self.policy = tmp / "policy.toml"
        self.policy.write_text(
            f'[files]\nroots = ["{self.ws}"]\n'
            '[shell]\nallow = ["echo", "cat", "ls", "env", "python3", "sh", "yes"]\ntimeout_ms = 5000\n'
            f'[code]\nindex_dir = "{tmp / "index"}"\n'
            f'[python]\nworkspaces = "{tmp / "pyws"}"\npython = "{sys.executable}"\ntimeout_ms = 5000\n'
            'memory_mb = 256\n')

    def serve(self, *requests: dict[str, Any], env: dict[str, str] | None = None) -> list[dict[str, Any]]:
        lines = [{"id": i, **r} for i, r in enumerate(requests)]
        extra = {"MACHINA_TOOLHOST_WORKSPACE": str(self.ws), "MACHINA_LEASE_KEY_FILE": str(self.key),
                 **(env or {})}
        out = serve(lines, "--policy", str(self.policy), "--audit-db", str(self.audit), env=extra, timeout=180)
        return sorted(out, key=lambda r: r["id"])


def call(aid: str, **inputs: Any) -> dict[str, Any]:
    return {"aid": aid, "input_json": json.dumps(inputs)}


def output(r: dict[str, Any]) -> Any:
    assert r["ok"] is True, r
    return json.loads(r["output_json"])


@pytest.fixture
def lab(tmp_path: Path, no_orphans: None) -> Lab:
    return Lab(tmp_path)


@pytest.fixture(scope="module")
def walls(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Skips the attacks on running code where this kernel cannot build the walls."""
    probe = Lab(tmp_path_factory.mktemp("probe"))
    r = probe.serve(call(EXEC, command="echo", args=["up"]), call(PYTHON, code="1"))
    skip_where_unconfinable(r)
    assert output(r[0])["stdout"] == "up\n" and output(r[1])["result"] == 1


# --- path escapes --------------------------------------------------------------------------

ESCAPES = ["../outside/secret.txt", "{outside}/secret.txt", "/etc/passwd", "/proc/self/environ",
           "sub/../../outside/secret.txt", "link_out", "dir_link/secret.txt", "hard_link", "{key}", "{audit}",
           "notes.txt\u0000.txt", "./../outside"]


def escape_paths(lab: Lab) -> list[str]:
    (lab.ws / "sub").mkdir()
    (lab.ws / "link_out").symlink_to(lab.outside / "secret.txt")
    (lab.ws / "dir_link").symlink_to(lab.outside)
    os.link(lab.outside / "secret.txt", lab.ws / "hard_link")
    return [p.format(outside=lab.outside, key=lab.key, audit=lab.audit) for p in ESCAPES]


def path_calls(path: str) -> list[dict[str, Any]]:
    return [call(READ, path=path), call(WRITE, path=path, content="pwned"), call(DELETE, path=path),
            call(LIST, path=path), call(GREP, pattern="secret|ZEBRA", path=path),
            call(EXEC, command="ls", cwd=path)]


def test_no_path_leads_out_of_the_root_through_any_tool(lab: Lab, walls: None) -> None:
    paths = escape_paths(lab)
    before = (snapshot(lab.outside), lab.key.read_text(), lab.audit.exists() and lab.audit.read_bytes())
    requests = [c for p in paths for c in path_calls(p)]
    answers = lab.serve(*requests, call("AID.ECHO.v1", up=1))
    for request, answer in zip(requests, answers, strict=False):
        if request in (call(DELETE, path="link_out"), call(DELETE, path="hard_link")):
            # A name inside the root goes; what it led to stays (checked below).
            assert answer["ok"] is True, answer
            continue
        assert answer["ok"] is False, (request, answer)
        assert answer["code"] in ("access_denied", "target_not_found", "invalid_input"), (request, answer)
        assert "ZEBRA" not in json.dumps(answer) and LEASE_SECRET not in json.dumps(answer)
    assert answers[-1]["ok"] is True
    assert snapshot(lab.outside) == before[0] and lab.key.read_text() == before[1]
    # Code run by the packs reaches no further: a command and Python code alike.
    r = lab.serve(call(EXEC, command="cat", args=[str(lab.outside / "secret.txt")]),
                  call(EXEC, command="cat", args=["dir_link/secret.txt"]),
                  call(PYTHON, code=f"open({str(lab.outside / 'secret.txt')!r}).read()"),
                  call(PYTHON, code=f"open({str(lab.ws / 'dir_link' / 'secret.txt')!r}).read()"),
                  call(PYTHON, code=f"open({str(lab.outside / 'new.txt')!r}, 'w').write('x')"))
    assert output(r[0])["exit_code"] != 0 and output(r[1])["exit_code"] != 0
    assert [output(a)["success"] for a in r[2:]] == [False, False, False]
    assert "ZEBRA" not in json.dumps(r)
    assert snapshot(lab.outside) == before[0]


def test_a_folder_swapped_for_a_link_while_calls_run_leaks_nothing(lab: Lab) -> None:
    flip = lab.ws / "flip"
    flip.mkdir()
    (flip / "secret.txt").write_text("inside copy\n")
    stop = threading.Event()

    def swap() -> None:
        real = lab.ws / "flip.real"
        while not stop.is_set():
            try:
                flip.rename(real)
                flip.symlink_to(lab.outside)
                flip.unlink()
                real.rename(flip)
            except OSError:
                pass

    t = threading.Thread(target=swap)
    t.start()
    try:
        requests = []
        for i in range(150):
            requests += [call(READ, path="flip/secret.txt"), call(LIST, path="flip"),
                         call(WRITE, path=f"flip/w{i}.txt", content="in"), call(GREP, pattern="ZEBRA", path="flip")]
        answers = lab.serve(*requests)
    finally:
        stop.set()
        t.join()
    assert all("ZEBRA" not in json.dumps(a) for a in answers)
    assert sorted(p.name for p in lab.outside.iterdir()) == ["secret.txt"]  # no write landed outside
    assert any(a["ok"] for a in answers)  # (and the race did not just refuse everything)


# --- injection through arguments -----------------------------------------------------------


def test_arguments_never_become_commands_or_options(lab: Lab, walls: None) -> None:
    marker = lab.ws / "pwned"
    tricks = ["; touch pwned", "$(touch pwned)", "`touch pwned`", "&& touch pwned", "| touch pwned",
              "\ntouch pwned", "' ; touch pwned ; '"]
    requests = [call(EXEC, command="echo", args=[t]) for t in tricks]
    requests += [call(EXEC, command=c) for c in ("echo; touch pwned", "echo && id", "../bin/sh", "bash", "rm")]
    # ripgrep options smuggled in as the pattern, or as the path.
    requests += [call(GREP, pattern="--pre=touch"), call(GREP, pattern="-f/etc/passwd"),
                 call(GREP, pattern="x", path="--pre=touch"), call(GREP, pattern="--files")]
    # FTS5 operators and a codebase id that is a path.
    requests += [call(SEARCH, query='notes" OR "x'), call(SEARCH, query="NEAR(a b) * : -x"),
                 call(SEARCH, query="hello", codebase_id="../outside")]
    requests += [call(PYTHON, code="import os\nos.system('touch pwned')"),
                 call(PYTHON, code="import subprocess\nsubprocess.run(['touch', 'pwned'])")]
    answers = lab.serve(*requests, call("AID.ECHO.v1", up=1))
    echoes = [output(a)["stdout"] for a in answers[:len(tricks)]]
    assert echoes == [t + "\n" for t in tricks]  # printed as they are: no shell ever ran
    commands = answers[len(tricks):len(tricks) + 5]
    assert [a["code"] for a in commands] == ["invalid_input", "invalid_input", "invalid_input", "access_denied",
                                             "access_denied"]
    greps = answers[len(tricks) + 5:len(tricks) + 9]
    for g in greps:  # a pattern is a pattern (no match here), a path an unknown name
        assert (g["ok"] and output(g)["matches"] == []) or g["code"] in ("target_not_found", "access_denied"), g
    searches = answers[len(tricks) + 9:len(tricks) + 12]
    assert searches[0]["ok"] and searches[1]["ok"] and searches[2]["code"] == "access_denied"
    system, run = (output(a) for a in answers[len(tricks) + 12:-1])
    assert system["success"] is True and system["result"] != 0  # os.system could not start a shell
    assert run["success"] is False and run["error_type"] == "PermissionError"
    assert answers[-1]["ok"]
    assert not marker.exists() and not list(lab.tmp.rglob("pwned"))


# --- the lease secret and the audit store --------------------------------------------------


def test_the_lease_secret_is_out_of_every_tools_reach(lab: Lab, walls: None) -> None:
    # The key file inside the root, where a careless operator might leave it.
    inside = lab.ws / "lease.key"
    inside.write_text(LEASE_SECRET)
    secret_env = {"MACHINA_LEASE_KEY_FILE": str(inside), "MACHINA_LEASE_SECRET": LEASE_SECRET}
    answers = lab.serve(
        call(READ, path="lease.key"), call(LIST, path="."), call(GREP, pattern=LEASE_SECRET[:12]),
        call(SEARCH, query=LEASE_SECRET[:12]), call(EXEC, command="cat", args=["lease.key"]),
        call(EXEC, command="env"), call(PYTHON, code=f"open({str(inside)!r}).read()"),
        call(PYTHON, code="import os\nsorted(os.environ)"),
        call(READ, path="/proc/self/environ"), call(PYTHON, code="open('/proc/1/environ', 'rb').read()"),
        env=secret_env)
    text = json.dumps(answers)
    assert LEASE_SECRET not in text and LEASE_SECRET[:12] not in text
    assert answers[0]["code"] == "access_denied"
    assert "lease.key" not in [e["path"] for e in output(answers[1])["entries"]]
    assert output(answers[2])["matches"] == [] and output(answers[3])["results"] == []
    assert output(answers[4])["stdout"] == ""  # covered by /dev/null in the command's world
    assert not [n for n in output(answers[5])["stdout"].splitlines() if n.startswith("MACHINA")]
    assert not [n for n in output(answers[7])["result"] if n.startswith("MACHINA")]


def test_the_audit_store_is_out_of_every_tools_reach(lab: Lab, walls: None) -> None:
    lab.serve(call("AID.ECHO.v1", first=1))  # the store exists
    store = str(lab.audit)
    answers = lab.serve(
        call(READ, path=store), call(WRITE, path=store, content="x"), call(DELETE, path=store + "-wal"),
        call(LIST, path=str(lab.audit.parent)), call(GREP, pattern="AID", path=str(lab.audit.parent)),
        call(EXEC, command="cat", args=[store]), call(EXEC, command="ls", args=[str(lab.audit.parent)]),
        call(PYTHON, code=f"open({store!r}, 'rb').read(100)"),
        call(PYTHON, code=f"import sqlite3\nsqlite3.connect({store!r}).execute('delete from batches')"))
    assert [a["code"] for a in answers[:5]] == ["access_denied"] * 5
    assert output(answers[5])["exit_code"] != 0 and output(answers[6])["exit_code"] != 0
    assert [output(a)["success"] for a in answers[7:]] == [False, False]
    import sqlite3

    con = sqlite3.connect(store)
    (n,) = con.execute("SELECT count(*) FROM calls").fetchone()
    con.close()
    assert n == 1 + len(answers)  # every attempt recorded, nothing deleted


# --- exhaustion, fork bombs, the network ----------------------------------------------------


def test_resource_exhaustion_through_every_tool_leaves_the_host_serving(lab: Lab, walls: None) -> None:
    many = lab.ws / "many"
    many.mkdir()
    for i in range(12_000):
        (many / f"f{i}").touch()
    (lab.ws / "aaaa.txt").write_text("a" * 200_000 + "\n")
    before = set(process_tree.descendants())
    t0 = time.monotonic()
    answers = lab.serve(
        call(WRITE, path="big.txt", content="x" * (2 << 20)),                      # over the write limit
        call(LIST, path="many", recursive=True),                                   # over the listing cap
        call(GREP, pattern="(a*)*b", path="aaaa.txt"),                             # backtracks in other engines
        call(SEARCH, query=" ".join(f"w{i}" for i in range(100))),                 # too many words
        call(EXEC, command="yes"),                                                 # output without end
        call(EXEC, command="python3", args=["-c", "x = bytearray(2 << 30); x[::4096] = b'1' * len(x[::4096])"]),
        call(PYTHON, code="x = bytearray(2 << 30)"),
        call(PYTHON, code="while True: pass"),
        call(PYTHON, code="print('x' * (50 << 20))"),
        call("AID.ECHO.v1", still="serving"))
    assert time.monotonic() - t0 < scaled(120)
    assert answers[0]["code"] == "invalid_input" and not (lab.ws / "big.txt").exists()
    assert output(answers[1])["truncated"] is True
    assert output(answers[2])["matches"] == []
    assert answers[3]["code"] == "invalid_input"
    assert answers[4]["code"] == "timeout"
    assert output(answers[5])["exit_code"] != 0
    assert [output(a)["success"] for a in answers[6:9]] == [False, False, True]
    assert output(answers[8])["truncated"] is True
    assert output(answers[9]) == {"still": "serving"}
    time.sleep(0.2)
    assert [p for p in process_tree.descendants() if p not in before] == []


def test_no_fork_bomb_starts_and_no_code_reaches_the_network(lab: Lab, walls: None) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    connect = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)"
    fork = "import os\nfor _ in range(100): os.fork()"
    try:
        before = set(process_tree.descendants())
        answers = lab.serve(
            call(EXEC, command="sh", args=["-c", "b(){ b|b& }; b"]),
            call(EXEC, command="python3", args=["-c", fork]),
            call(EXEC, command="python3", args=["-c", connect]),
            call(PYTHON, code=fork), call(PYTHON, code=connect),
            call("AID.ECHO.v1", still="serving"))
        assert [output(a)["exit_code"] != 0 for a in answers[:3]] == [True, True, True]
        assert "PermissionError" in output(answers[2])["stderr"]
        assert [output(a)["success"] for a in answers[3:5]] == [False, False]
        assert output(answers[5]) == {"still": "serving"}
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody ever connected
        time.sleep(0.2)
        assert [p for p in process_tree.descendants() if p not in before] == []
    finally:
        listener.close()
