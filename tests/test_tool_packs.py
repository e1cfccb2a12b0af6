"""The built-in tool packs (docs/tool-packs.md) and their policy, through --serve: the
file tools (read, write, delete, list) under our aids and their service names, confined to
the policy's roots with deny globs and size limits; shell.exec (allow and deny lists, no
shell, walls, deadline, output caps); rate limits; per-user roots; the policy file's
errors. After every refusal the file system is checked to be as it was."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import process_tree
import pytest
from conftest import LEASE_SECRET, TOOLHOST, base_env, scaled, serve

SERVICE_ERROR_TYPE = {"access_denied": "AccessDenied", "rate_limited": "AccessDenied", "target_not_found": "NotFound",
             "invalid_input": "InvalidInput", "system_error": "SystemError"}


def snapshot(root: Path) -> dict[str, Any]:
    """Every name beneath `root` with its kind and content (links by their target)."""
    out: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir",)
            elif p.is_file():
                out[rel] = ("file", p.read_bytes())
            else:
                out[rel] = ("other",)
    return out


class Packs:
    """A workspace, an outside folder and a policy; calls through --serve."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.ws = tmp / "ws"
        self.outside = tmp / "outside"
        self.ws.mkdir()
        self.outside.mkdir()
        (self.outside / "secret.txt").write_text("outside secret\n")
        (self.ws / "notes.txt").write_text("hello\n")
        self.policy_text = ""

    def policy(self, text: str) -> None:
        self.policy_text = text

    def serve(self, *requests: dict[str, Any], env: dict[str, str] | None = None, args: tuple[str, ...] = ()
              ) -> list[dict[str, Any]]:
        extra = {"MACHINA_TOOLHOST_WORKSPACE": str(self.ws), **(env or {})}
        if self.policy_text:
            path = self.tmp / "policy.toml"
            path.write_text(self.policy_text)
            args = (*args, "--policy", str(path))
        lines = [{"id": i, **r} for i, r in enumerate(requests)]
        out = serve(lines, *args, env=extra, timeout=60)
        return sorted(out, key=lambda r: r["id"])

    def call(self, aid: str, user: str | None = None, **inputs: Any) -> dict[str, Any]:
        req: dict[str, Any] = {"aid": aid, "input_json": json.dumps(inputs)}
        if user is not None:
            req["user"] = user
        return self.serve(req)[0]


def output(r: dict[str, Any]) -> Any:
    assert r["ok"] is True, r
    return json.loads(r["output_json"])


def refused(r: dict[str, Any], code: str, contains: str = "") -> None:
    assert r["ok"] is False and r["code"] == code, r
    assert r["error"].startswith(SERVICE_ERROR_TYPE[code] + ": "), r["error"]
    assert contains in r["error"], r["error"]


@pytest.fixture
def packs(tmp_path: Path) -> Packs:
    return Packs(tmp_path)


# --- file tools ---------------------------------------------------------------------------


def test_file_tools_in_both_shapes(packs: Packs) -> None:
    ws = packs.ws
    r = packs.serve(
        {"aid": "tools.file.write", "input_json": json.dumps({"path": "src/a.ex", "content": "defmodule A"})},
        {"aid": "writeFile", "input_json": json.dumps({"path": str(ws / "src" / "b.ex"), "content": "bb"})},
        {"aid": "AID.FILE.WRITE.v1", "input_json": json.dumps({"path": "src/b.ex", "content": "!", "append": True})},
        {"aid": "tools.file.read", "input_json": json.dumps({"path": "src/b.ex"})},
        {"aid": "readFile", "input_json": json.dumps({"path": str(ws / "notes.txt")})},
        {"aid": "AID.FILE.READ.v1", "input_json": json.dumps({"path": "notes.txt", "max_bytes": 3})},
        {"aid": "tools.file.list", "input_json": json.dumps({"path": str(ws), "recursive": True, "pattern": "*.ex"})},
        {"aid": "AID.FILE.LIST.v1", "input_json": json.dumps({"path": "src"})},
        {"aid": "tools.file.delete", "input_json": json.dumps({"path": "src/a.ex"})},
        {"aid": "AID.FILE.DELETE.v1", "input_json": json.dumps({"path": "src/a.ex"})},
    )
    assert output(r[0]) == {"bytes_written": 11}                       # the service shape
    assert output(r[1]) == {"bytes_written": 2}
    assert output(r[2]) == {"path": "src/b.ex", "bytes_written": 1, "append": True}
    assert output(r[3]) == "bb!"                                       # the service shape: the text itself
    assert output(r[4]) == "hello\n"
    assert output(r[5]) == {"path": "notes.txt", "content": "hel", "truncated": True, "size": 6}
    assert output(r[6]) == [{"path": f"{ws}/src/a.ex", "size": 11, "type": "file"},
                            {"path": f"{ws}/src/b.ex", "size": 3, "type": "file"}]
    assert output(r[7]) == {"path": "src", "truncated": False,
                            "entries": [{"path": "src/a.ex", "size": 11, "type": "file"},
                                        {"path": "src/b.ex", "size": 3, "type": "file"}]}
    assert output(r[8]) == {"deleted": True}
    refused(r[9], "target_not_found", "src/a.ex")
    assert not (ws / "src" / "a.ex").exists() and (ws / "src" / "b.ex").read_text() == "bb!"


def test_listing_shows_links_without_following_them_and_hides_denied_names(packs: Packs) -> None:
    ws = packs.ws
    (ws / "out").symlink_to(packs.outside)
    (ws / ".env").write_text("SECRET=1\n")
    (ws / ".ssh").mkdir()
    (ws / ".ssh" / "id_ed25519").write_text("key")
    (ws / "deep" / "er").mkdir(parents=True)
    (ws / "deep" / "er" / "x.pem").write_text("pem")
    (ws / "deep" / "er" / "ok.txt").write_text("ok")
    entries = output(packs.call("listFiles", path=".", recursive=True))
    assert {e["path"]: e["type"] for e in entries} == {
        "deep": "directory", "deep/er": "directory", "deep/er/ok.txt": "file", "notes.txt": "file",
        "out": "symlink"}


def test_a_listing_stops_at_its_cap(packs: Packs) -> None:
    for i in range(30):
        (packs.ws / f"f{i:02}").write_text("")
    packs.policy("[files]\nmax_list_entries = 10\n")
    out = output(packs.call("AID.FILE.LIST.v1", path="."))
    assert len(out["entries"]) == 10 and out["truncated"] is True


@pytest.mark.parametrize(
    ("aid", "inputs", "code", "contains"),
    [
        ("readFile", {"path": "/etc/passwd"}, "access_denied", "outside the allowed directories"),
        ("readFile", {"path": "../outside/secret.txt"}, "access_denied", "'..' is not allowed"),
        ("tools.file.read", {"path": "OUTSIDE/secret.txt"}, "access_denied", "outside the allowed directories"),
        ("AID.FILE.READ.v1", {"path": "link/secret.txt"}, "access_denied", "symbolic link"),
        ("AID.FILE.READ.v1", {"path": "passwd"}, "access_denied", "symbolic link"),
        ("AID.FILE.READ.v1", {"path": "hard"}, "access_denied", "hard link"),
        ("AID.FILE.READ.v1", {"path": "fifo"}, "access_denied", "not a regular file"),
        ("AID.FILE.READ.v1", {"path": "null"}, "access_denied", "symbolic link"),
        ("AID.FILE.READ.v1", {"path": ".env"}, "access_denied", "deny pattern '.env'"),
        ("AID.FILE.READ.v1", {"path": "conf/.env.local"}, "access_denied", "deny pattern '.env.*'"),
        ("AID.FILE.READ.v1", {"path": "server.pem"}, "access_denied", "deny pattern '*.pem'"),
        ("AID.FILE.READ.v1", {"path": "keys/id_rsa"}, "access_denied", "deny pattern 'id_*'"),
        ("AID.FILE.READ.v1", {"path": "credentials.json"}, "access_denied", "deny pattern 'credentials.json'"),
        ("AID.FILE.READ.v1", {"path": ".git/config"}, "access_denied", "deny pattern '.git/config'"),
        ("AID.FILE.READ.v1", {"path": ".ssh/known_hosts"}, "access_denied", "deny pattern '.ssh'"),
        ("AID.FILE.WRITE.v1", {"path": ".env", "content": "X=1"}, "access_denied", "deny pattern '.env'"),
        ("AID.FILE.WRITE.v1", {"path": "link/new.txt", "content": "x"}, "access_denied", "symbolic link"),
        ("AID.FILE.WRITE.v1", {"path": "hard", "content": "x"}, "access_denied", "hard link"),
        ("AID.FILE.WRITE.v1", {"path": "/tmp/escape.txt", "content": "x"}, "access_denied", "outside"),
        ("AID.FILE.DELETE.v1", {"path": ".git/config"}, "access_denied", "deny pattern"),
        ("AID.FILE.DELETE.v1", {"path": "fifo"}, "access_denied", "not a regular file"),
        ("AID.FILE.DELETE.v1", {"path": "../outside/secret.txt"}, "access_denied", "'..'"),
        ("AID.FILE.DELETE.v1", {"path": "conf"}, "invalid_input", "directory"),
        ("AID.FILE.LIST.v1", {"path": "link"}, "access_denied", "symbolic link"),
        ("AID.FILE.LIST.v1", {"path": "/"}, "access_denied", "outside"),
        ("AID.FILE.READ.v1", {"path": "missing.txt"}, "target_not_found", "missing.txt"),
        ("AID.FILE.READ.v1", {"path": "a\u0000b"}, "invalid_input", "NUL"),
    ],
)
def test_what_could_lead_out_or_is_denied_is_refused(packs: Packs, aid: str, inputs: dict[str, Any], code: str,
                                                     contains: str) -> None:
    ws = packs.ws
    (ws / "link").symlink_to(packs.outside)
    (ws / "passwd").symlink_to("/etc/passwd")
    (ws / "null").symlink_to("/dev/null")
    os.link(packs.outside / "secret.txt", ws / "hard")
    os.mkfifo(ws / "fifo")
    (ws / "conf").mkdir()
    (ws / "conf" / ".env.local").write_text("A=1")
    (ws / "keys").mkdir()
    (ws / "keys" / "id_rsa").write_text("key")
    (ws / ".git").mkdir()
    (ws / ".git" / "config").write_text("[core]")
    (ws / ".ssh").mkdir()
    (ws / ".ssh" / "known_hosts").write_text("h")
    for name in (".env", "server.pem", "credentials.json"):
        (ws / name).write_text("secret")
    inputs = {k: v.replace("OUTSIDE", str(packs.outside)) if isinstance(v, str) else v for k, v in inputs.items()}
    before_ws, before_out = snapshot(ws), snapshot(packs.outside)
    refused(packs.call(aid, **inputs), code, contains)
    assert snapshot(ws) == before_ws and snapshot(packs.outside) == before_out
    assert not Path("/tmp/escape.txt").exists()


def test_size_limits(packs: Packs) -> None:
    packs.policy("[files]\nmax_read_bytes = 100\nmax_write_bytes = 50\n")
    (packs.ws / "big.txt").write_text("x" * 101)
    refused(packs.call("readFile", path="big.txt"), "invalid_input", "over the read limit of 100 bytes")
    refused(packs.call("AID.FILE.READ.v1", path="big.txt", max_bytes=101), "invalid_input", "over the read limit")
    assert output(packs.call("AID.FILE.READ.v1", path="big.txt"))["truncated"] is True  # a prefix may be asked for
    refused(packs.call("writeFile", path="new/w.txt", content="y" * 51), "invalid_input", "over the write limit")
    assert not (packs.ws / "new").exists()
    assert output(packs.call("writeFile", path="new/w.txt", content="y" * 50)) == {"bytes_written": 50}


def test_text_that_is_not_utf8_is_refused_not_mangled(packs: Packs) -> None:
    (packs.ws / "bin").write_bytes(b"\xff\xfe\x00")
    refused(packs.call("readFile", path="bin"), "invalid_input", "not UTF-8")


def test_the_lease_key_is_never_read_even_inside_a_root(packs: Packs, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "lease.key").write_text(LEASE_SECRET)
    packs.policy(f'[files]\nroots = ["{packs.ws}", "{keys}"]\ndeny = []\n')
    r = packs.serve({"aid": "readFile", "input_json": json.dumps({"path": str(keys / "lease.key")})},
                    {"aid": "listFiles", "input_json": json.dumps({"path": str(keys)})},
                    {"aid": "deleteFile", "input_json": json.dumps({"path": str(keys / "lease.key")})},
                    env={"MACHINA_LEASE_KEY_FILE": str(keys / "lease.key")})
    refused(r[0], "access_denied", "protected")
    assert output(r[1]) == []
    refused(r[2], "access_denied", "protected")
    assert (keys / "lease.key").read_text() == LEASE_SECRET


# --- per-user roots, rate limits ------------------------------------------------------------


def test_a_user_sees_only_their_own_roots(packs: Packs, tmp_path: Path) -> None:
    alice = tmp_path / "alice"
    alice.mkdir()
    (alice / "mine.txt").write_text("alice's\n")
    packs.policy(f'unknown_users = false\n[users.alice]\nroots = ["{alice}"]\n[users.bob]\n')
    assert output(packs.call("readFile", user="alice", path="mine.txt")) == "alice's\n"
    refused(packs.call("readFile", user="alice", path=str(packs.ws / "notes.txt")), "access_denied", "outside")
    refused(packs.call("readFile", user="alice", path="notes.txt"), "target_not_found")  # (not in alice's root)
    assert output(packs.call("readFile", user="bob", path="notes.txt")) == "hello\n"     # bob: the [files] roots
    assert output(packs.call("readFile", path="notes.txt")) == "hello\n"                 # no user: the same
    refused(packs.call("readFile", user="mallory", path="notes.txt"), "access_denied", "not in the policy")


def test_user_must_be_a_short_string(packs: Packs) -> None:
    r = packs.serve({"aid": "readFile", "input_json": "{}", "user": ""},
                    {"aid": "readFile", "input_json": "{}", "user": 7},
                    {"aid": "readFile", "input_json": "{}", "user": "u" * 257})
    assert [x["code"] for x in r] == ["malformed_request"] * 3, r
    assert "user" in r[0]["error"] and "user" in r[1]["error"]


def test_rate_limits_per_tool_and_user(packs: Packs) -> None:
    packs.policy('[rate_limits]\n"tools.file.read" = "2/min"\n"AID.FILE.LIST.v1" = "1/h"\n')
    read = {"aid": "tools.file.read", "input_json": json.dumps({"path": "notes.txt"})}
    r = packs.serve(read, read, read, {**read, "user": "other"},
                    {"aid": "readFile", "input_json": json.dumps({"path": "notes.txt"})},
                    {"aid": "AID.FILE.LIST.v1", "input_json": "{}"}, {"aid": "listFiles", "input_json": "{}"})
    assert [x["ok"] for x in r] == [True, True, False, True, True, True, False], r
    refused(r[2], "rate_limited", "rate limit of 2 calls per 60 s for tools.file.read")
    # A limit named by a tool's aid covers its other names; a service name's covers itself.
    refused(r[6], "rate_limited", "AID.FILE.LIST.v1")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[files]\nrots = []\n", "policy.toml:2: [files]: unknown field 'rots'"),
        ("[files]\nroots = ['/no/such/dir']\n",
         "policy.toml:2: [files]: field 'roots': '/no/such/dir' is not a directory"),
        ("[files]\nmax_read_bytes = -1\n", "field 'max_read_bytes': must be from 0 to"),
        ("[shell]\nallow = ['./x']\n", "field 'allow': './x' is neither a command name nor an absolute path"),
        ("[rate_limits]\n'AID.X.v1' = '5/day'\n", "field 'AID.X.v1': must be like"),
        ("[rate_limits]\n'AID.X.v1' = 5\n", "must be a string like"),
        ("[users.a]\ncodebases = ['nope']\n", "'nope' is not in [codebases]"),
        ("files = 1\n", "'files' must be a table"),
        ("[files\n", "policy.toml:1:"),
        ("surprise = true\n", "unknown field 'surprise'"),
    ],
)
def test_a_bad_policy_file_stops_the_host_with_its_place(packs: Packs, text: str, message: str) -> None:
    import subprocess

    path = packs.tmp / "policy.toml"
    path.write_text(text)
    proc = subprocess.run([TOOLHOST, "--serve", "--policy", str(path)], input=b"", capture_output=True,
                          env=base_env({"MACHINA_TOOLHOST_WORKSPACE": str(packs.ws)}), timeout=30)
    assert proc.returncode == 2 and message in proc.stderr.decode(), proc.stderr


# --- shell.exec -----------------------------------------------------------------------------


def shell(packs: Packs, command: str, *args: str, aid: str = "AID.SHELL.EXEC.v1", **extra: Any) -> dict[str, Any]:
    return packs.call(aid, command=command, args=list(args), **extra)


def test_no_command_runs_by_default(packs: Packs) -> None:
    refused(shell(packs, "ls"), "access_denied",
            "Command 'ls' is not allowed by security policy (the policy allows no command)")


def test_an_allowed_command_runs_without_a_shell(packs: Packs) -> None:
    packs.policy('[shell]\nallow = ["echo", "ls", "pwd"]\n')
    out = output(shell(packs, "echo", "$(id)", "; rm -rf /", "`x`"))
    assert out["stdout"] == "$(id) ; rm -rf / `x`\n" and out["exit_code"] == 0 and out["truncated"] is False
    service = output(shell(packs, "ls", aid="tools.shell.exec"))
    assert set(service) == {"stdout", "stderr", "exit_code", "truncated"} and "notes.txt" in service["stdout"]
    (packs.ws / "sub").mkdir()
    assert output(shell(packs, "pwd", cwd="sub"))["stdout"] == f"{packs.ws}/sub\n"
    assert output(shell(packs, "pwd", cwd=str(packs.ws)))["stdout"] == f"{packs.ws}\n"
    refused(shell(packs, "pwd", cwd="/tmp"), "access_denied", "outside")
    refused(shell(packs, "pwd", cwd="../outside"), "access_denied", "'..'")
    refused(shell(packs, "pwd", cwd="nope"), "target_not_found")


@pytest.mark.parametrize(
    ("command", "code", "contains"),
    [
        ("ls; rm -rf /", "invalid_input", "no shell runs here"),
        ("$(rm)", "invalid_input", "no shell runs here"),
        ("./ls", "invalid_input", "no shell runs here"),
        ("rm", "access_denied", "Command 'rm' is not allowed by security policy"),
        ("/bin/rm", "access_denied", "Command 'rm' is not allowed"),
        ("sudo", "access_denied", "Command 'sudo' is not allowed"),
        ("cat", "access_denied", "Command 'cat' is not allowed"),
        ("innocent", "access_denied", "Command 'innocent' is not allowed"),  # a link to rm
        ("nosuchcmd", "target_not_found", "not found in"),
    ],
)
def test_commands_outside_the_lists_are_refused(packs: Packs, command: str, code: str, contains: str) -> None:
    bin_dir = packs.tmp / "bin"
    bin_dir.mkdir()
    (bin_dir / "innocent").symlink_to("/bin/rm")
    packs.policy(f'[shell]\nallow = ["ls", "rm", "innocent", "nosuchcmd"]\npath = ["{bin_dir}", "/usr/bin", "/bin"]\n')
    before = snapshot(packs.ws)
    refused(shell(packs, command, "-rf", "."), code, contains)
    assert snapshot(packs.ws) == before


def test_a_command_is_walled_in(packs: Packs) -> None:
    (packs.ws / ".env").write_text("TOKEN=hunter2\n")
    (packs.ws / ".ssh").mkdir()
    (packs.ws / ".ssh" / "id_ed25519").write_text("private key\n")
    packs.policy('[shell]\nallow = ["python3", "cat", "env"]\n')
    py = "python3"
    net = output(shell(packs, py, "-c", "import socket; socket.create_connection(('127.0.0.1', 22), timeout=2)"))
    assert net["exit_code"] != 0 and "PermissionError" in net["stderr"]
    write = output(shell(packs, py, "-c", f"open({str(packs.outside / 'new.txt')!r}, 'w')"))
    assert write["exit_code"] != 0 and not (packs.outside / "new.txt").exists()
    inside = output(shell(packs, py, "-c", "open('made.txt', 'w').write('ok')"))
    assert inside["exit_code"] == 0 and (packs.ws / "made.txt").read_text() == "ok"
    outside_read = output(shell(packs, "cat", str(packs.outside / "secret.txt")))
    assert outside_read["exit_code"] != 0 and "outside secret" not in outside_read["stdout"]
    # What the file tools refuse by name, a command does not see either.
    hidden = output(shell(packs, "cat", ".env", ".ssh/id_ed25519"))
    assert "hunter2" not in hidden["stdout"] and "private key" not in hidden["stdout"]
    fork = output(shell(packs, py, "-c", "import os; os.fork()"))
    assert fork["exit_code"] != 0 and "PermissionError" in fork["stderr"]
    env = output(packs.serve({"aid": "AID.SHELL.EXEC.v1", "input_json": json.dumps({"command": "env"})},
                             env={"MACHINA_LEASE_SECRET": LEASE_SECRET, "SOME_API_KEY": "sk-123"})[0])
    names = {line.split("=", 1)[0] for line in env["stdout"].splitlines()}
    assert names == {"PATH", "HOME", "LANG", "LC_ALL", "TERM"}, env["stdout"]


def test_the_scan_for_denied_names_is_capped(packs: Packs) -> None:
    """A command's walls hide the denied names beneath its roots; finding them looks at no more
    than [shell] max_scanned_entries names, and a root with more is refused, not half-walled."""
    for i in range(4):
        (packs.ws / "d" / str(i)).mkdir(parents=True)
        (packs.ws / "d" / str(i) / ".env").write_text("hunter2\n")
    packs.policy('[shell]\nallow = ["cat"]\nmax_scanned_entries = 9\n')  # notes.txt, d, 4 folders, 4 files
    refused(shell(packs, "cat", "d/0/.env"), "system_error", "more than 9 names beneath")
    packs.policy('[shell]\nallow = ["cat"]\nmax_scanned_entries = 13\n')
    hidden = output(shell(packs, "cat", "d/0/.env", "d/3/.env"))
    assert "hunter2" not in hidden["stdout"]
    shown = output(shell(packs, "cat", "notes.txt"))
    assert shown["stdout"] == "hello\n"


def test_output_is_capped_and_says_so(packs: Packs) -> None:
    packs.policy('[shell]\nallow = ["python3"]\nmax_output_bytes = 1000\n')
    out = output(shell(packs, "python3", "-c", "import sys; print('o' * 100000); print('e' * 10, file=sys.stderr)"))
    assert out["stdout"] == "o" * 1000 and out["stdout_truncated"] is True and out["truncated"] is True
    assert out["stderr"] == "e" * 10 + "\n" and out["stderr_truncated"] is False and out["exit_code"] == 0


def test_memory_and_cpu_limits(packs: Packs) -> None:
    packs.policy('[shell]\nallow = ["python3"]\nmemory_mb = 64\ncpu_seconds = 1\n')
    big = output(shell(packs, "python3", "-c", "x = bytearray(400 << 20); x[::4096] = b'1' * len(x[::4096])"))
    assert big["exit_code"] != 0 and "killed" in big, big
    spin = output(shell(packs, "python3", "-c", "while True: pass"))
    assert spin["exit_code"] != 0 and spin["duration_ms"] < scaled(10) * 1000


def test_a_command_past_its_deadline_is_killed_with_its_group(packs: Packs) -> None:
    packs.policy('[shell]\nallow = ["sleep", "sh"]\nsubprocesses = true\ntimeout_ms = 400\n')
    before = set(process_tree.descendants())
    t0 = time.monotonic()
    r = packs.serve({"aid": "AID.SHELL.EXEC.v1",
                     "input_json": json.dumps({"command": "sh", "args": ["-c", "sleep 30 & sleep 30 & wait"]})},
                    {"aid": "AID.SHELL.EXEC.v1", "input_json": json.dumps({"command": "sleep", "args": ["30"]}),
                     "timeout_ms": 200})
    assert time.monotonic() - t0 < scaled(10)
    assert r[0]["code"] == "timeout" and "its process group was killed" in r[0]["error"], r[0]
    assert r[1]["code"] == "timeout", r[1]
    time.sleep(0.2)
    left = [p for p in process_tree.descendants() if p not in before and "sleep" in " ".join(process_tree.cmdline(p))]
    assert left == [], left


def test_fork_bombs_and_runaway_output_leave_the_host_serving(packs: Packs) -> None:
    packs.policy('[shell]\nallow = ["sh", "yes"]\ntimeout_ms = 1000\n')
    r = packs.serve(
        {"aid": "AID.SHELL.EXEC.v1", "input_json": json.dumps({"command": "sh", "args": ["-c", "b(){ b|b& }; b"]})},
        {"aid": "AID.SHELL.EXEC.v1", "input_json": json.dumps({"command": "yes"})},
        {"aid": "AID.ECHO.v1", "input_json": "1"},
    )
    assert r[0]["ok"] is True and output(r[0])["exit_code"] != 0      # no process could be started
    assert r[1]["code"] == "timeout"                                   # read and dropped past the cap until killed
    assert r[2]["ok"] is True


def test_packs_can_be_chosen_or_left_out(packs: Packs) -> None:
    import subprocess

    def aids(*args: str) -> set[str]:
        proc = subprocess.run([TOOLHOST, *args, "--list"], capture_output=True, env=base_env(), timeout=30)
        assert proc.returncode == 0, proc.stderr
        return {t["aid"] for t in json.loads(proc.stdout)["tools"]}

    default = aids()
    assert {"AID.FILE.READ.v1", "tools.file.read", "readFile", "AID.SHELL.EXEC.v1", "execCommand"} <= default
    assert "AID.SHELL.EXEC.v1" not in aids("--packs", "files") and "AID.FILE.READ.v1" in aids("--packs", "files")
    assert not {a for a in aids("--packs", "none") if a.startswith("AID.FILE")}
    proc = subprocess.run([TOOLHOST, "--packs", "cheese", "--list"], capture_output=True, env=base_env(), timeout=30)
    assert proc.returncode == 2 and b"unknown tool pack 'cheese' (there are: files, shell, code, python)" in proc.stderr


# --- code.grep ------------------------------------------------------------------------------


def test_grep_finds_what_grep_finds_and_respects_gitignore_and_denied_names(packs: Packs) -> None:
    ws = packs.ws
    (ws / "lib").mkdir()
    (ws / "lib" / "my_controller.ex").write_text("defmodule MyController do\n  def index, do: :ok\nend\n")
    (ws / "lib" / "page.ex").write_text("# defmodule PageController is elsewhere\ndefmodule Page do\nend\n")
    (ws / "lib" / "id_token.ex").write_text("defmodule SecretController do\n")        # denied: id_*
    (ws / ".env").write_text("defmodule EnvController\n")                             # denied and hidden
    (ws / "build").mkdir()
    (ws / "build" / "out.ex").write_text("defmodule BuiltController do\n")            # .gitignore'd
    (ws / ".gitignore").write_text("build/\n")
    (ws / "blob.bin").write_bytes(b"\x00\x01defmodule BinController\x00")              # binary
    (ws / "out").symlink_to(packs.outside)
    (packs.outside / "x.ex").write_text("defmodule OutsideController do\n")           # behind a link
    r = packs.serve(
        {"aid": "tools.code.grep", "input_json": json.dumps({"pattern": "defmodule.*Controller", "path": "/lib"})},
        {"aid": "tools.code.grep", "input_json": json.dumps({"pattern": "defmodule.*Controller"})},
        {"aid": "grepCode", "input_json": json.dumps({"pattern": "^DEFMODULE PAGE ", "ignore_case": True,
                                                      "path": str(ws / "lib")})},
        {"aid": "AID.CODE.GREP.v1", "input_json": json.dumps({"pattern": "def", "max_results": 2})},
        {"aid": "AID.CODE.GREP.v1", "input_json": json.dumps({"pattern": "(unclosed"})},
        {"aid": "AID.CODE.GREP.v1", "input_json": json.dumps({"pattern": "x", "path": "out"})},
        {"aid": "AID.CODE.GREP.v1", "input_json": json.dumps({"pattern": "x", "path": "../outside"})},
        {"aid": "AID.CODE.GREP.v1", "input_json": json.dumps({"pattern": "index", "path": "lib/my_controller.ex"})},
    )
    refused(r[0], "access_denied", "outside")  # an absolute path outside the roots
    assert output(r[1]) == [{"path": "lib/my_controller.ex", "line": 1, "content": "defmodule MyController do"},
                            {"path": "lib/page.ex", "line": 1, "content": "# defmodule PageController is elsewhere"}]
    assert output(r[2]) == [{"path": f"{ws}/lib/page.ex", "line": 2, "content": "defmodule Page do"}]
    capped = output(r[3])
    assert len(capped["matches"]) == 2 and capped["truncated"] is True
    refused(r[4], "invalid_input", "not a regular expression")
    refused(r[5], "access_denied", "symbolic link")
    refused(r[6], "access_denied", "'..'")
    assert output(r[7]) == {"matches": [{"path": "lib/my_controller.ex", "line": 2, "content": "  def index, do: :ok"}],
                            "truncated": False}


def test_grep_cuts_long_lines(packs: Packs) -> None:
    (packs.ws / "long.txt").write_text("needle" + "é" * 2000 + "\n")
    (match,) = output(packs.call("grepCode", pattern="needle"))
    assert match["content"].startswith("needle") and len(match["content"].encode()) <= 500


def test_without_landlock_commands_are_refused_not_run_unconfined(packs: Packs) -> None:
    packs.policy('[shell]\nallow = ["touch"]\n')
    r = packs.serve({"aid": "AID.SHELL.EXEC.v1", "input_json": json.dumps({"command": "touch", "args": ["made"]})},
                    env={"MACHINA_TOOLHOST_NO_LANDLOCK": "1"})[0]
    refused(r, "system_error", "needs Landlock")
    assert not (packs.ws / "made").exists()


def test_git_hooks_cannot_be_written(packs: Packs) -> None:
    refused(packs.call("writeFile", path=".git/hooks/pre-commit", content="#!/bin/sh\nrm -rf ~\n"), "access_denied",
            "'.git/hooks'")
    assert not (packs.ws / ".git").exists()


def test_the_rate_limit_table_is_bounded(packs: Packs) -> None:
    # Buckets are kept per tool and user, at most 10 000: a flood of user names empties the
    # table (no bucket was full again, so all go) instead of growing it.
    packs.policy('[rate_limits]\n"AID.FILE.LIST.v1" = "1/h"\n')
    listing = {"aid": "AID.FILE.LIST.v1", "input_json": "{}"}
    r = packs.serve({**listing, "user": "u0"}, {**listing, "user": "u0"},
                    *({**listing, "user": f"u{i}"} for i in range(1, 10_000)),
                    {**listing, "user": "u0"}, {**listing, "user": "u10000"}, {**listing, "user": "u0"})
    assert r[0]["ok"] is True and r[1]["code"] == "rate_limited"
    assert all(x["ok"] for x in r[2:10_001])
    assert r[10_001]["code"] == "rate_limited"  # u0's bucket is still there: the table is full, not past it
    assert r[10_002]["ok"] is True and r[10_003]["ok"] is True  # the 10 001st user emptied it
