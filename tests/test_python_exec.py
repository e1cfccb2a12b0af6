"""execute_python, install_python_package and list_python_packages (docs/tool-packs.md#execute_python)
through --serve, md.InProcess and md.Pool, with the real sandbox: the result of the last
expression, stdout and stderr, values without a JSON form represented, every advice case,
sessions (state kept, idle timeout, cap), limits (time, CPU, memory, output, result, code),
installs from local wheels built here (no network needed), sync_workspace, and the red
team's attacks on executed code (network, new processes, writing outside, the lease key,
other sessions' folders, resource exhaustion), each refused with the host still serving.
Where the kernel cannot build the walls, the calls are refused with SystemError (tested
with Landlock turned off) and the rest is skipped."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import machina_dispatch as md
import process_tree
import pytest
from conftest import LEASE_SECRET, TOOLHOST, base_env, scaled, serve, skip_where_unconfinable
from python_support import make_wheel

EXECUTE = "AID.PYTHON.EXECUTE.v1"
INSTALL = "AID.PYTHON.INSTALL.v1"
LIST = "AID.PYTHON.LIST.v1"
SERVICE_ERROR_TYPE = {"access_denied": "AccessDenied", "target_not_found": "NotFound", "invalid_input": "InvalidInput",
             "system_error": "SystemError"}
SERVICE_SUCCESS_FIELDS = {"success", "result", "stdout", "stderr", "executionTime"}
SERVICE_FAILURE_FIELDS = {"success", "error", "traceback", "advice", "stdout", "stderr", "executionTime"}


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, str)):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(v)


class Py:
    """A file workspace, Python workspaces, an outside folder and a policy ([python] keys in
    `settings`, more TOML before them in `more`); calls through --serve."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.ws = tmp / "ws"
        self.pyws = tmp / "pyws"
        self.outside = tmp / "outside"
        for d in (self.ws, self.pyws, self.outside):
            d.mkdir()
        (self.outside / "secret.txt").write_text("outside secret\n")
        (self.ws / "notes.txt").write_text("hello\n")
        self.settings: dict[str, Any] = {}
        self.more = ""

    def policy(self) -> Path:
        lines = [self.more, "[python]", f"workspaces = {toml_value(str(self.pyws))}",
                 f"python = {toml_value(sys.executable)}"]
        lines += [f"{k} = {toml_value(v)}" for k, v in self.settings.items()]
        path = self.tmp / "policy.toml"
        path.write_text("\n".join(lines) + "\n")
        return path

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {"MACHINA_TOOLHOST_WORKSPACE": str(self.ws), **(extra or {})}

    def serve(self, *requests: dict[str, Any], env: dict[str, str] | None = None,
              args: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        lines = [{"id": i, **r} for i, r in enumerate(requests)]
        out = serve(lines, "--policy", str(self.policy()), *args, env=self.env(env), timeout=120)
        return sorted(out, key=lambda r: r["id"])

    def call(self, aid: str, user: str | None = None, **inputs: Any) -> dict[str, Any]:
        return self.serve(request(aid, user, **inputs))[0]

    def host(self, env: dict[str, str] | None = None, workers: int = 4) -> Host:
        return Host(["--policy", str(self.policy()), "--workers", str(workers)], self.env(env))


def request(aid: str, user: str | None = None, timeout_ms: int | None = None, **inputs: Any) -> dict[str, Any]:
    r: dict[str, Any] = {"aid": aid, "input_json": json.dumps(inputs)}
    if user is not None:
        r["user"] = user
    if timeout_ms is not None:
        r["timeout_ms"] = timeout_ms
    return r


class Host:
    """A --serve host driven a line at a time, for calls that must wait on each other."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([TOOLHOST, "--serve", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=base_env(env))
        self.ids = 0
        self.buffer = b""
        self.answers: dict[int, dict[str, Any]] = {}

    def send(self, aid: str, user: str | None = None, timeout_ms: int | None = None, **inputs: Any) -> int:
        assert self.proc.stdin is not None
        self.ids += 1
        self.proc.stdin.write(json.dumps({"id": self.ids, **request(aid, user, timeout_ms, **inputs)}).encode() + b"\n")
        self.proc.stdin.flush()
        return self.ids

    def answer(self, rid: int, timeout: float = 60) -> dict[str, Any]:
        assert self.proc.stdout is not None
        end = time.monotonic() + timeout
        while rid not in self.answers:
            while b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                r = json.loads(line)
                self.answers[r["id"]] = r
            if rid in self.answers:
                break
            left = end - time.monotonic()
            assert left > 0, f"no answer to {rid} within {timeout} s"
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
                assert chunk, f"the host ended: {self.proc.stderr.read() if self.proc.stderr else b''!r}"
                self.buffer += chunk
        return self.answers.pop(rid)

    def call(self, aid: str, user: str | None = None, timeout_ms: int | None = None, **inputs: Any) -> dict[str, Any]:
        return self.answer(self.send(aid, user, timeout_ms, **inputs))

    def run(self, code: str, **inputs: Any) -> dict[str, Any]:
        out: dict[str, Any] = output(self.call(EXECUTE, code=code, **inputs))
        return out

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(timeout=30) == 0
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        if self.proc.stderr is not None:
            self.proc.stderr.close()


def output(r: dict[str, Any]) -> Any:
    assert r["ok"] is True, r
    return json.loads(r["output_json"])


def refused(r: dict[str, Any], code: str, contains: str = "") -> None:
    assert r["ok"] is False and r["code"] == code, r
    if code in SERVICE_ERROR_TYPE:
        assert r["error"].startswith(SERVICE_ERROR_TYPE[code] + ": "), r["error"]
    assert contains in r["error"], r["error"]


def code_failed(o: dict[str, Any], error_type: str, advice: str | None = None) -> None:
    """A failure of the code's own: a result, with the error, its traceback and advice."""
    assert o["success"] is False and o["error_type"] == error_type, o
    assert o["error"].startswith(error_type), o
    if advice is not None:
        assert o["advice"] is not None and advice in o["advice"], o


@pytest.fixture
def py(tmp_path: Path, no_orphans: None) -> Py:
    return Py(tmp_path)


@pytest.fixture(scope="module")
def confined(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Skips the module's sandboxed tests where this kernel cannot build the walls."""
    probe = Py(tmp_path_factory.mktemp("probe"))
    r = probe.call(EXECUTE, code="1")
    skip_where_unconfinable([r])
    assert output(r)["result"] == 1, r


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wheels")
    make_wheel(folder, "tinypkg", "1.0", {"tinypkg/__init__.py": "VALUE = 42\n"})
    make_wheel(folder, "tinyapp", "0.3", {"tinyapp/__init__.py": "from tinypkg import VALUE\nDOUBLE = 2 * VALUE\n"},
               requires=("tinypkg",))
    make_wheel(folder, "other_pkg", "2.1", {"other_pkg/__init__.py": "NAME = 'other'\n"})
    return folder


def use_wheels(py: Py, wheels: Path) -> None:
    py.settings.update(find_links=[str(wheels)], no_index=True)


# --- names, results, output -----------------------------------------------------------------


def test_the_three_tools_answer_under_every_name() -> None:
    proc = subprocess.run([TOOLHOST, "--packs", "python", "--list"], capture_output=True, env=base_env(), timeout=30)
    assert proc.returncode == 0, proc.stderr
    tools = {t["aid"]: t for t in json.loads(proc.stdout)["tools"]}
    for aid, subject, function in [(EXECUTE, "tools.python.execute", "execute_python"),
                                   (INSTALL, "tools.python.install", "install_python_package"),
                                   (LIST, "tools.python.list", "list_python_packages")]:
        assert aid in tools and "alias_of" not in tools[aid]
        assert tools[subject]["alias_of"] == aid and tools[function]["alias_of"] == aid
    assert {a for a, t in tools.items() if "pack" in t.get("tags", [])} == {
        EXECUTE, INSTALL, LIST, "tools.python.execute", "tools.python.install", "tools.python.list", "execute_python",
        "install_python_package", "list_python_packages"}


def test_the_last_expression_is_the_result_with_stdout_and_stderr(py: Py, confined: None) -> None:
    code = "import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\nx = 20\nx * 2 + 2"
    r = py.serve(request(EXECUTE, code=code), request("execute_python", code=code),
                 request("tools.python.execute", code="y = 1"), request(EXECUTE, code="print('no result')\n"),
                 request(EXECUTE, code=""))
    ours, service = output(r[0]), output(r[1])
    assert set(service) == SERVICE_SUCCESS_FIELDS, service                    # exactly the service fields
    assert service["success"] is True and service["result"] == 42
    assert service["stdout"] == "to stdout\n" and service["stderr"] == "to stderr\n"
    assert isinstance(service["executionTime"], (int, float)) and service["executionTime"] >= 0
    assert ours["result"] == 42 and ours["stdout"] == "to stdout\n" and ours["truncated"] is False
    assert ours["stdout_truncated"] is False and ours["result_truncated"] is False and ours["duration_ms"] >= 0
    assert set(output(r[2])) == SERVICE_SUCCESS_FIELDS and output(r[2])["result"] is None  # an assignment: no value
    assert output(r[3])["result"] is None and output(r[3])["stdout"] == "no result\n"
    assert output(r[4])["success"] is True and output(r[4])["result"] is None


def test_values_without_a_json_form_are_represented(py: Py, confined: None) -> None:
    cases = {
        "float('nan')": {"repr": "nan", "type": "float"},
        "float('-inf')": {"repr": "-inf", "type": "float"},
        "b'ab\\x00'": {"repr": "b'ab\\x00'", "type": "bytes"},
        "{3, 1, 2}": {"repr": "{1, 2, 3}", "type": "set"},
        "frozenset()": {"repr": "frozenset()", "type": "frozenset"},
        "1 + 2j": {"repr": "(1+2j)", "type": "complex"},
        "{1: 'a'}": {"repr": "{1: 'a'}", "type": "dict"},
        "[1, (2, 3), {'k': float('inf')}]": [1, [2, 3], {"k": {"repr": "inf", "type": "float"}}],
        "import decimal; decimal.Decimal('1.5')": {"repr": "Decimal('1.5')", "type": "decimal.Decimal"},
        "class Odd:\n    def __repr__(self): raise ValueError('no')\nOdd()": None,
        "10 ** 5000": {"repr": "<an int of about 5001 digits>", "type": "int"},
        "'\\ud800 lone'": "\ufffd lone",
        "{'nested': [[[[1]]]], 'ok': True, 'none': None}": {"nested": [[[[1]]]], "ok": True, "none": None},
    }
    r = py.serve(*(request(EXECUTE, code=c) for c in cases), request(EXECUTE, code="a = []\na.append(a)\na"))
    for (code, expected), answer in zip(cases.items(), r[:-1], strict=True):
        o = output(answer)
        assert o["success"] is True, (code, o)
        if code.startswith("class Odd"):
            assert o["result"]["type"] == "Odd" and "repr() failed: ValueError: no" in o["result"]["repr"]
        else:
            assert o["result"] == expected, (code, o["result"])
    cyclic = output(r[-1])["result"]
    assert isinstance(cyclic, list) and cyclic[0]["type"] == "list"  # a cycle is cut, not followed


def test_output_result_and_code_are_capped_and_say_so(py: Py, confined: None) -> None:
    py.settings.update(max_output_bytes=1000, max_result_bytes=2000, max_code_bytes=5000)
    r = py.serve(request(EXECUTE, code="import sys\nprint('o' * 100000)\nprint('é' * 10, file=sys.stderr)"),
                 request(EXECUTE, code="list(range(1_000_000))"),
                 request(EXECUTE, code="x = 1\n" + "#" * 6000),
                 request(EXECUTE, code="print('x' * 10**8)"))
    capped = output(r[0])
    assert capped["stdout"] == "o" * 1000 and capped["stdout_truncated"] is True and capped["truncated"] is True
    assert capped["stderr"] == "é" * 10 + "\n" and capped["stderr_truncated"] is False
    big = output(r[1])
    assert big["result_truncated"] is True and big["result"]["truncated"] is True
    assert big["result"]["type"] == "list" and big["result"]["repr"].startswith("[0, 1, 2, ")
    assert len(json.dumps(big["result"])) <= 2000
    refused(r[2], "invalid_input", "over the limit of 5000 ([python] max_code_bytes)")
    assert len(output(r[3])["stdout"]) == 1000


# --- advice -----------------------------------------------------------------------------


def test_a_syntax_error_is_a_result_with_its_line_and_advice(py: Py, confined: None) -> None:
    code = "x = 1\ny = 2\nfor i in range(3)\n    print(i)\n"
    ours, service = (output(a) for a in py.serve(request(EXECUTE, code=code), request("execute_python", code=code)))
    code_failed(ours, "SyntaxError", "line 3")
    assert ours["line"] == 3 and "(line 3)" in ours["error"] and "expected ':'" in ours["error"]
    assert 'File "<code>", line 3' in ours["traceback"] and "for i in range(3)" in ours["traceback"]
    assert set(service) == SERVICE_FAILURE_FIELDS and service["success"] is False and service["error"] == ours["error"]
    assert service["advice"] == ours["advice"] and service["traceback"] == ours["traceback"]


def test_a_missing_module_suggests_install_python_package(py: Py, confined: None) -> None:
    r = py.serve(request(EXECUTE, code="import surely_not_installed_pkg"), request(EXECUTE, code="import yaml_x\n"),
                 request(EXECUTE, code="import yaml"), request(EXECUTE, code="import json.nosuch"),
                 request(EXECUTE, code="def f():\n    return 1 / 0\nf()"))
    code_failed(output(r[0]), "ModuleNotFoundError", "install_python_package (package: 'surely_not_installed_pkg')")
    assert "install_packages: ['surely_not_installed_pkg']" in output(r[0])["advice"]
    code_failed(output(r[1]), "ModuleNotFoundError", "'yaml_x'")
    yaml = output(r[2])
    if yaml["success"] is False:  # (unless this interpreter has PyYAML)
        code_failed(yaml, "ModuleNotFoundError", "package: 'PyYAML'")
    code_failed(output(r[3]), "ModuleNotFoundError", "The package 'json' is installed but has no module 'json.nosuch'")
    division = output(r[4])
    code_failed(division, "ZeroDivisionError")
    assert division["advice"] is None and division["line"] == 2
    # The traceback is the code's own: none of the runner's frames.
    assert division["traceback"].startswith("Traceback (most recent call last):\n  File \"<code>\", line 3")
    assert "python_exec" not in division["traceback"] and "tool_worker" not in division["traceback"]


def test_a_call_past_its_time_limit_is_answered_on_time_and_its_worker_killed(py: Py, confined: None) -> None:
    py.settings.update(timeout_ms=1000, cpu_seconds=0)
    with py.host() as h:
        assert h.run("x = 5", session_id="s")["session_new"] is True
        t0 = time.monotonic()
        o = h.run("while True: pass", session_id="s")
        assert time.monotonic() - t0 < scaled(8)
        code_failed(o, "TimeoutError", "variables are lost")
        assert "time limit of 1000 ms" in o["error"] and o["session_ended"] is True
        again = h.run("x", session_id="s")  # a new session: x is gone
        code_failed(again, "NameError", "This session has just started")
        assert again["session_new"] is True
        code_failed(h.run("import time\ntime.sleep(60)"), "TimeoutError", "a session_id keeps variables")
        assert h.run("1 + 1")["result"] == 2  # (a fresh worker took the killed one's place)
        # A call's own deadline shorter than the limit: the host's timeout, on time.
        t0 = time.monotonic()
        refused(h.call(EXECUTE, code="while True: pass", timeout_ms=300), "timeout",
                "the code ran past the call's deadline")
        assert time.monotonic() - t0 < scaled(5)
        assert h.run("2 + 2")["result"] == 4
        # An interpreter that ends itself: a result, the session gone with it.
        h.run("y = 1", session_id="gone")
        ended = h.run("import os\nos._exit(3)", session_id="gone")
        code_failed(ended, "SystemError", "variables are lost")
        assert "exited with status 3" in ended["error"] and ended["session_ended"] is True
        code_failed(h.run("import os\nos._exit(3)"), "SystemError", "The interpreter itself stopped")
        assert h.run("3 + 3")["result"] == 6


def test_memory_and_cpu_limits_are_results_with_advice(py: Py, confined: None) -> None:
    py.settings.update(memory_mb=256, cpu_seconds=1, timeout_ms=30000)
    with py.host() as h:
        code_failed(h.run("x = bytearray(600 << 20)"), "MemoryError", "limit is 256 MB")
        h.run("kept = 'still here'", session_id="cpu")
        t0 = time.monotonic()
        o = h.run("while True: pass", session_id="cpu")
        code_failed(o, "TimeoutError", "CPU time limit of 1 s")
        assert "CPU time limit" in o["error"] and time.monotonic() - t0 < scaled(20)
        assert o["session_ended"] is False
        assert h.run("kept", session_id="cpu")["result"] == "still here"  # the worker lived on
        code_failed(h.run("def f(n): return f(n + 1)\nf(0)"), "RecursionError", "recursed deeper")


# --- sessions ---------------------------------------------------------------------------


def test_calls_without_a_session_start_afresh(py: Py, confined: None) -> None:
    py.settings.update(workers=1)
    with py.host() as h:
        h.run("x = 1\nopen('left.txt', 'w').write('x')")
        code_failed(h.run("x"), "NameError")
        assert h.run("import os\nos.listdir('.')")["result"] == []  # a folder of its own each time
        # Temporary files go there too; nothing can be written beside it.
        assert h.run("import os, tempfile\n"
                     "tempfile.gettempdir() == os.getcwd() == os.environ['HOME']")["result"] is True
        code_failed(h.run("open('../stray.txt', 'w').write('x')"), "PermissionError")
        assert h.run("import os\n[n for n in os.listdir('..') if not n.isdigit()]")["result"] == []
        # The import system's finder for each call's folder goes with the folder.
        count = ("import sys\ntry:\n    import surely_missing_module\nexcept ImportError:\n    pass\n"
                 "len(sys.path_importer_cache)")
        sizes = [h.run(count)["result"] for _ in range(4)]
        assert sizes == [sizes[0]] * 4, sizes
        # A thread left running would run beside the next caller's code: its worker is replaced.
        h.run("import threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()")
        assert h.run("import threading\nthreading.active_count()")["result"] == 1


def test_interpreters_and_call_folders_are_capped(py: Py, confined: None) -> None:
    # Each call without a session takes a folder before it waits for an interpreter; a folder
    # is removed after its call (a thread of its retired interpreter could still write to it).
    py.settings.update(workers=1)
    with py.host(workers=80) as h:
        ids = [h.send(EXECUTE, code="import os, time\ntime.sleep(0.02)\nlen(os.listdir('.'))") for _ in range(80)]
        most = 0
        for _ in range(10):  # (the calls take 1.6 s, one at a time)
            most = max(most, len(sandbox_launchers(h.proc.pid)))
            time.sleep(0.05)
        assert most == 1  # [python] workers = 1: one interpreter, whatever the calls waiting
        assert all(output(h.answer(i))["result"] == 0 for i in ids)
        (calls,) = py.pyws.glob("default/run/*/calls")
        assert list(calls.iterdir()) == []  # (80 were taken at once)


def test_a_session_keeps_its_variables_and_sessions_are_apart(py: Py, confined: None) -> None:
    with py.host() as h:
        first = h.run("import math\nx = 41\ndef f(): return x + 1", session_id="a")
        assert first["session_new"] is True and first["session_id"] == "a"
        again = h.run("f()", session_id="a")
        assert again["result"] == 42 and again["session_new"] is False
        code_failed(h.run("x", session_id="b"), "NameError")
        code_failed(h.run("x"), "NameError")
        # A function defined by an earlier call fails with that call's source in its traceback.
        h.run("def g():\n    return 1 / 0", session_id="a")
        tb = h.run("g()", session_id="a")["traceback"]
        assert "return 1 / 0" in tb and 'File "<code #' in tb
        service = output(h.call("execute_python", code="x", session_id="a"))
        assert set(service) == SERVICE_SUCCESS_FIELDS and service["result"] == 41
        # Files stay in a session's folder between its calls.
        h.run("open('kept.txt', 'w').write('kept')", session_id="a")
        assert h.run("open('kept.txt').read()", session_id="a")["result"] == "kept"


def test_an_idle_session_ends(py: Py, confined: None) -> None:
    py.settings.update(session_idle_ms=300)
    with py.host() as h:
        h.run("x = 1", session_id="idle")
        assert len(sandbox_launchers(h.proc.pid)) == 1
        time.sleep(1.5)
        assert sandbox_launchers(h.proc.pid) == []  # the idle session's worker is gone
        o = h.run("x", session_id="idle")
        code_failed(o, "NameError", "This session has just started")
        assert o["session_new"] is True


def sandbox_launchers(host: int) -> list[int]:
    """The host's sandbox launchers (one per worker): its children started with --sandbox-exec."""
    found = []
    for pid in process_tree.descendants():
        stat = process_tree._stat(pid)
        if stat is not None and stat[1] == host and "--sandbox-exec" in process_tree.cmdline(pid):
            found.append(pid)
    return found


def test_sessions_are_capped_the_idlest_idle_one_ends(py: Py, confined: None) -> None:
    py.settings.update(max_sessions=2)
    with py.host() as h:
        h.run("x = 'one'", session_id="one")
        h.run("x = 'two'", session_id="two")
        h.run("x", session_id="one")  # now "two" is the idlest
        assert h.run("x = 'three'", session_id="three")["session_new"] is True
        assert h.run("x", session_id="one")["result"] == "one"
        code_failed(h.run("x", session_id="two"), "NameError", "just started")  # ended to make room
        assert len(sandbox_launchers(h.proc.pid)) <= 2


def test_when_every_session_is_busy_a_new_one_is_refused(py: Py, confined: None) -> None:
    py.settings.update(max_sessions=1)
    with py.host() as h:
        h.run("import time", session_id="busy")
        slow = h.send(EXECUTE, code="time.sleep(2)\n'done'", session_id="busy")
        time.sleep(0.5)
        refused(h.call(EXECUTE, code="1", session_id="other"), "system_error", "all 1 Python sessions")
        assert output(h.answer(slow))["result"] == "done"
        assert h.run("2")["result"] == 2  # calls without a session still run
        refused(py.call(EXECUTE, code="1", session_id="a/b"), "invalid_input", "session_id must be")
        py.settings.update(max_sessions=0)
        refused(py.call(EXECUTE, code="1", session_id="s"), "access_denied", "allows no Python session")


# --- installs ---------------------------------------------------------------------------


def test_install_from_local_wheels_skips_what_is_installed_and_lists_it(py: Py, confined: None, wheels: Path) -> None:
    use_wheels(py, wheels)
    with py.host() as h:
        code_failed(h.run("import tinyapp"), "ModuleNotFoundError", "install_python_package")
        first = output(h.call(INSTALL, package="tinyapp==0.3"))
        assert first["success"] is True and first["already_installed"] is False, first
        assert sorted((p["name"], p["version"]) for p in first["installed"]) == [("tinyapp", "0.3"), ("tinypkg", "1.0")]
        again = output(h.call(INSTALL, package="tinyapp"))
        assert again["success"] is True and again["already_installed"] is True and again["installed"] == []
        assert output(h.call("install_python_package", package="tinypkg")) == {"success": True, "package": "tinypkg"}
        assert h.run("import tinyapp\ntinyapp.DOUBLE")["result"] == 84
        listed = output(h.call(LIST))
        mine = {p["name"]: p for p in listed["packages"] if p["installed"]}
        assert mine == {"tinyapp": {"name": "tinyapp", "version": "0.3", "installed": True},
                        "tinypkg": {"name": "tinypkg", "version": "1.0", "installed": True}}
        assert listed["python"] == f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"
        service = output(h.call("list_python_packages"))
        assert set(service) == {"success", "packages"} and {"name": "tinypkg", "version": "1.0"} in service["packages"]
        assert all(set(p) == {"name", "version"} for p in service["packages"])
        with_install = h.run("import other_pkg\nother_pkg.NAME", install_packages=["other_pkg"])
        assert with_install["result"] == "other"
        assert with_install["installed"] == [{"package": "other_pkg",
                                              "installed": [{"name": "other_pkg", "version": "2.1"}]}]


def test_an_install_stops_at_the_first_failure_with_pips_words(py: Py, confined: None, wheels: Path) -> None:
    use_wheels(py, wheels)
    r = py.serve(request(EXECUTE, code="'never ran'", install_packages=["tinypkg", "nosuchpkg", "other_pkg"]),
                 request(LIST), request(INSTALL, package="nosuchpkg"), request("install_python_package", package="x2"),
                 request("execute_python", code="1", install_packages=["nosuchpkg"]))
    o = output(r[0])
    assert o["success"] is False and o["error_type"] == "InstallError" and "never ran" not in json.dumps(o)
    assert o["error"].startswith("Failed to install package nosuchpkg: ")
    assert "No matching distribution found for nosuchpkg" in o["error"]  # pip's own words
    assert o["installed"] == [{"package": "tinypkg", "installed": [{"name": "tinypkg", "version": "1.0"}]}]
    installed = {p["name"] for p in output(r[1])["packages"] if p["installed"]}
    assert installed == {"tinypkg"}  # other_pkg was never tried
    failed = output(r[2])
    assert failed["success"] is False and "No matching distribution found for nosuchpkg" in failed["error"]
    assert output(r[3]) == {"success": False, "error": output(r[3])["error"]}
    assert output(r[3])["error"].startswith("Failed to install package x2: ")
    service = output(r[4])
    assert set(service) == {"success", "error"} and service["success"] is False


def test_pip_reaches_the_network_the_code_never_does_and_is_stopped_at_its_limit(py: Py, confined: None,
                                                                                 listener: socket.socket) -> None:
    # An index that takes the connection and never answers: pip (in the installer's walls)
    # connects, and is stopped at install_timeout_ms; the code cannot even make a socket.
    port = listener.getsockname()[1]
    py.settings.update(index_url=f"http://127.0.0.1:{port}/simple/", install_timeout_ms=3000)
    t0 = time.monotonic()
    r = py.serve(request(INSTALL, package="tinypkg"),
                 request(EXECUTE, code=f"import socket\nsocket.create_connection(('127.0.0.1', {port}))"))
    assert time.monotonic() - t0 < scaled(60)
    failed = output(r[0])
    assert failed["success"] is False, failed
    assert failed["error"] == ("Failed to install package tinypkg: pip ran past the install time limit of 3000 ms "
                               "([python] install_timeout_ms) and was stopped")
    connection, _ = listener.accept()  # pip's
    connection.close()
    code_failed(output(r[1]), "PermissionError", "no network")  # (refused at socket(2): it never connected)


@pytest.mark.parametrize(
    ("spec", "settings", "code", "contains"),
    [
        ("--index-url=http://evil.example/simple", {}, "invalid_input", "options cannot be given"),
        ("-r/etc/passwd", {}, "invalid_input", "options cannot be given"),
        ("tinypkg --index-url http://evil.example", {}, "invalid_input", "is not a package name"),
        ("../tinypkg", {}, "invalid_input", "is not a package name"),
        ("/tmp/tinypkg-1.0-py3-none-any.whl", {}, "invalid_input", "is not a package name"),
        ("https://files.example/tinypkg-1.0-py3-none-any.whl", {}, "invalid_input", "paths and URLs are not packages"),
        ("tinypkg @ https://files.example/t.whl", {}, "access_denied", "names a URL, which the policy does not allow"),
        ("tinypkg @ file:///tmp/t.whl", {"allow_urls": True}, "invalid_input", "a URL must be https://"),
        ("tinypkg; os_name == 'posix'", {}, "invalid_input", "is not a package name"),
        ("tinypkg\nother_pkg", {}, "invalid_input", "not printable ASCII"),
        ("tinypkg", {"allow": ["other*"]}, "access_denied", "Package 'tinypkg' is not allowed by security policy"),
        ("TinyPkg>=1", {"deny": ["tiny*"]}, "access_denied", "Package 'tinypkg' is not allowed"),
        ("tinypkg", {"allow": []}, "access_denied", "the policy allows no install"),
    ],
)
def test_package_specs_are_checked_before_anything_runs(py: Py, confined: None, wheels: Path, spec: str,
                                                        settings: dict[str, Any], code: str, contains: str) -> None:
    use_wheels(py, wheels)
    py.settings.update(settings)
    r = py.serve(request(INSTALL, package=spec), request(EXECUTE, code="1", install_packages=["tinypkg", spec]),
                 request(LIST))
    refused(r[0], code, contains)
    refused(r[1], code, contains)
    assert not [p for p in output(r[2])["packages"] if p["installed"]]  # not even tinypkg, listed first


def test_installs_belong_to_their_workspace(py: Py, confined: None, wheels: Path) -> None:
    use_wheels(py, wheels)
    alice = py.tmp / "alice"
    alice.mkdir()
    py.more = f'[users.alice]\nroots = ["{alice}"]\n'
    r = py.serve(request(INSTALL, user="alice", package="tinypkg"),
                 request(EXECUTE, user="alice", code="import tinypkg\ntinypkg.VALUE"),
                 request(EXECUTE, user="bob", code="import tinypkg"),  # bob: not listed, the defaults' workspace
                 request(EXECUTE, code="import tinypkg"))
    assert output(r[0])["success"] is True and output(r[1])["result"] == 42
    code_failed(output(r[2]), "ModuleNotFoundError", "install_python_package")
    code_failed(output(r[3]), "ModuleNotFoundError")
    py.more = 'unknown_users = false\n'
    refused(py.call(EXECUTE, user="mallory", code="1"), "access_denied", "not in the policy")


# --- sync_workspace -------------------------------------------------------------------------


def test_sync_workspace_copies_what_the_file_tools_see(py: Py, confined: None) -> None:
    ws = py.ws
    (ws / "data").mkdir()
    (ws / "data" / "numbers.csv").write_text("1,2,3\n")
    (ws / ".env").write_text("TOKEN=hunter2\n")
    (ws / "id_rsa").write_text("private key\n")
    (ws / "out").symlink_to(py.outside)
    os.link(py.outside / "secret.txt", ws / "hard")
    keys = py.tmp / "keys"
    keys.mkdir()
    (keys / "lease.key").write_text(LEASE_SECRET)
    (keys / "k.txt").write_text("k")
    code = ("import os\nsorted(os.path.relpath(os.path.join(d, f)) for d, _, fs in os.walk('.') for f in fs)")
    with py.host() as h:
        seen = h.run(code, sync_workspace=True)
        assert seen["result"] == ["data/numbers.csv", "notes.txt"], seen
        assert seen["synced"] == {"files": 2, "bytes": 12, "skipped": 4}
        assert h.run("open('data/numbers.csv').read()", sync_workspace=True)["result"] == "1,2,3\n"
        code_failed(h.run("open('notes.txt').read()"), "FileNotFoundError")  # only when asked
        # A copy: what the code writes stays in its own folder.
        h.run("open('notes.txt', 'w').write('changed')", sync_workspace=True)
        assert (ws / "notes.txt").read_text() == "hello\n"
        # In a session, the copy goes over the session's folder: its own files stay.
        h.run("open('mine.txt', 'w').write('mine')", session_id="s")
        (ws / "notes.txt").write_text("hello again\n")
        both = h.run("import os\nsorted(os.listdir('.'))", session_id="s", sync_workspace=True)
        assert both["result"] == ["data", "mine.txt", "notes.txt"]
        assert h.run("open('notes.txt').read()", session_id="s")["result"] == "hello again\n"
    # The lease key is never copied, even from a root that holds it; a copy is capped.
    py.more = f'[files]\nroots = ["{keys}"]\ndeny = []\n'
    py.settings.update(sync_max_files=5)
    r = py.serve(request(EXECUTE, code="import os\nsorted(os.listdir('.'))", sync_workspace=True),
                 env={"MACHINA_LEASE_KEY_FILE": str(keys / "lease.key")})
    assert output(r[0])["result"] == ["k.txt"]
    for i in range(6):
        (keys / f"f{i}").write_text("x")
    refused(py.serve(request(EXECUTE, code="1", sync_workspace=True))[0], "system_error", "more than 5 files")
    py.settings.update(sync_max_files=100, sync_max_bytes=3)
    refused(py.serve(request(EXECUTE, code="1", sync_workspace=True))[0], "system_error", "[python] sync_max_files")


# --- the red team -----------------------------------------------------------------------------


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(4)
    s.setblocking(False)
    yield s
    s.close()


def test_no_network_from_executed_code(py: Py, confined: None, listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    attacks = [
        f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)",
        "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', 9))",
        "import socket\nsocket.socket(socket.AF_UNIX)",
        "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:%d/' % " + str(port) + ", timeout=2)",
    ]
    raw = ("import ctypes, ctypes.util\nlibc = ctypes.CDLL(None, use_errno=True)\n"
           "fd = libc.syscall(41, 2, 1, 0)\n(fd, ctypes.get_errno())")  # socket(AF_INET, SOCK_STREAM) by number
    r = py.serve(*(request(EXECUTE, code=a) for a in attacks), request(EXECUTE, code=raw),
                 request(EXECUTE, code="import socket\nsocket.socketpair()[0].fileno() > 0"),
                 request(EXECUTE, code="1"))
    for answer in r[:len(attacks)]:
        o = output(answer)
        assert o["success"] is False and ("PermissionError" in o["error"] or "Permission denied" in o["error"]), o
        if o["error_type"] == "PermissionError":
            assert "no network" in o["advice"]
    assert output(r[len(attacks)])["result"] == [-1, 13]  # EACCES from seccomp
    assert output(r[-2])["result"] is True  # socketpair still works (it reaches nothing)
    assert output(r[-1])["result"] == 1
    with pytest.raises(BlockingIOError):
        listener.accept()  # nothing ever connected


def test_no_new_processes(py: Py, confined: None) -> None:
    attacks = ["import os\nwhile True:\n    os.fork()",
               "import subprocess\nsubprocess.run(['/bin/echo', 'escaped'])",
               "import os\nos.posix_spawn('/bin/echo', ['echo', 'escaped'], {})",
               "import os\nos.execv('/bin/echo', ['echo', 'escaped'])",
               "import multiprocessing\nmultiprocessing.Process(target=print).start()"]
    fork = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n(libc.fork(), ctypes.get_errno())"
    r = py.serve(*(request(EXECUTE, code=a) for a in attacks), request(EXECUTE, code=fork),
                 request(EXECUTE, code="import os\nos.system('echo escaped')"),
                 request(EXECUTE, code="import threading\nt = threading.Thread(target=print, args=('thread',))\n"
                                       "t.start(); t.join()"),
                 request(EXECUTE, code="'serving'"))
    for attack, answer in zip(attacks, r[:len(attacks)], strict=True):
        o = output(answer)
        assert o["success"] is False, (attack, o)
        assert "escaped" not in o["stdout"] + o["stderr"]
        assert o["error_type"] in ("PermissionError", "OSError") or "not permitted" in o["error"], (attack, o)
    assert output(r[len(attacks)])["result"] == [-1, 1]  # EPERM from seccomp
    system = output(r[len(attacks) + 1])
    assert system["result"] != 0 and "escaped" not in system["stdout"] + system["stderr"]  # (no shell could start)
    assert output(r[-2])["stdout"] == "thread\n"  # threads still work
    assert output(r[-1])["result"] == "serving"


def test_no_writing_outside_its_own_folder(py: Py, confined: None) -> None:
    targets = [py.outside / "new.txt", py.ws / "new.txt", py.pyws / "planted.pth",
               Path("/tmp") / f"escape-{os.getpid()}"]
    attacks = [f"open({str(t)!r}, 'w').write('x')" for t in targets]
    attacks += [f"import os\nos.symlink({str(py.outside)!r}, 'link')\nopen('link/via-link.txt', 'w').write('x')",
                "import site, os\nopen(os.path.join(site.getsitepackages()[0], 'evil.pth'), 'w').write('import os')",
                f"import os\nos.rename('.', {str(py.outside / 'moved')!r})"]
    r = py.serve(*(request(EXECUTE, code=a) for a in attacks), request(EXECUTE, code="open('ok.txt', 'w').write('ok')"))
    for attack, answer in zip(attacks, r[:len(attacks)], strict=True):
        o = output(answer)
        assert o["success"] is False and o["error_type"] in ("PermissionError", "OSError"), (attack, o)
    assert output(r[-1])["result"] == 2  # its own folder is writable
    for t in targets:
        assert not t.exists()
    assert sorted(p.name for p in py.outside.iterdir()) == ["secret.txt"]
    assert not list(py.pyws.rglob("evil.pth")) and not list(py.pyws.rglob("planted.pth"))


def test_no_reading_the_lease_key_or_the_hosts_files(py: Py, confined: None) -> None:
    keys = py.tmp / "keys"
    keys.mkdir()
    key = keys / "lease.key"
    key.write_text(LEASE_SECRET)
    attacks = [f"open({str(key)!r}).read()", f"open({str(py.outside / 'secret.txt')!r}).read()",
               "open('/etc/shadow').read()", "open('/proc/1/environ', 'rb').read()", "import os\ndict(os.environ)",
               f"open({str(py.ws / 'notes.txt')!r}).read()", "import os\nos.listdir('/')"]
    r = py.serve(*(request(EXECUTE, code=a) for a in attacks), request(EXECUTE, code="'serving'"),
                 env={"MACHINA_LEASE_KEY_FILE": str(key), "MACHINA_LEASE_SECRET": LEASE_SECRET})
    for attack, answer in zip(attacks, r[:len(attacks)], strict=True):
        text = answer["output_json"]
        assert LEASE_SECRET not in text and "outside secret" not in text and "hello" not in text, (attack, text)
    # The key file reads as nothing (it is covered) or not at all; the rest is refused.
    assert output(r[0])["success"] is False or output(r[0])["result"] == ""
    assert [output(a)["success"] for a in r[1:]] == [False, False, False, True, False, False, True]
    environ = output(r[4])["result"]
    assert not [k for k in environ if k.startswith("MACHINA")], environ
    # A key file where the code may read (its workspace's environment) is covered all the same.
    inside = py.pyws / "default" / "env" / "lease.key"
    inside.parent.mkdir(parents=True, exist_ok=True)
    inside.write_text(LEASE_SECRET)
    r = py.serve(request(EXECUTE, code=f"open({str(inside)!r}).read()"), request(EXECUTE, code="'serving'"),
                 env={"MACHINA_LEASE_KEY_FILE": str(inside)})
    assert output(r[0])["result"] == "" and output(r[1])["result"] == "serving"


def test_no_reading_other_sessions_or_workspaces(py: Py, confined: None) -> None:
    alice = py.tmp / "alice"
    alice.mkdir()
    py.more = f'[users.alice]\nroots = ["{alice}"]\n'
    with py.host() as h:
        where = h.run("import os\nopen('diary.txt', 'w').write('dear diary')\nos.getcwd()", session_id="a")["result"]
        mine = h.run("import os\nopen('x.txt', 'w').write('x')\nos.getcwd()", user="alice", session_id="a")["result"]
        assert where != mine
        diary = os.path.join(where, "diary.txt")
        attempts: list[tuple[str | None, dict[str, Any]]] = [(None, {"session_id": "b"}), (None, {}),
                                                             ("alice", {"session_id": "a"}), ("alice", {})]
        for user, attempt in attempts:
            o = output(h.call(EXECUTE, user=user, code=f"open({diary!r}).read()", **attempt))
            code_failed(o, "PermissionError", "sandbox refused")
            listing = output(h.call(EXECUTE, user=user, code=f"import os\nos.listdir({os.path.dirname(where)!r})",
                                    **attempt))
            assert listing["success"] is False
        assert h.run("open('diary.txt').read()", session_id="a")["result"] == "dear diary"


def test_resource_exhaustion_leaves_the_host_serving(py: Py, confined: None) -> None:
    py.settings.update(timeout_ms=1500, memory_mb=256, file_size_mb=1, max_output_bytes=10000, workers=2)
    attacks = {
        "print('x' * 10**9)": "MemoryError",
        "import sys\nwhile True:\n    sys.stdout.write('y' * 65536)": "TimeoutError",
        "x = []\nwhile True:\n    x.append(bytearray(10 << 20))": "MemoryError",
        "open('big', 'wb').write(b'z' * (2 << 20))": "OSError",
        "import threading, time\nfor _ in range(10000):\n    threading.Thread(target=time.sleep, args=(30,)).start()":
            None,
        "import os\nfor i in range(100000):\n    os.open(f'f{i}', os.O_CREAT | os.O_WRONLY)": "OSError",
        "while True: pass": "TimeoutError",
    }
    r = py.serve(*(request(EXECUTE, code=a) for a in attacks), request(EXECUTE, code="'still serving'"),
                 args=("--workers", "4"))
    for (attack, kind), answer in zip(attacks.items(), r[:-1], strict=True):
        o = output(answer)
        assert o["success"] is False, (attack, o)
        if kind is not None:
            assert o["error_type"] == kind, (attack, o)
    assert output(r[-1])["result"] == "still serving"


def test_without_landlock_python_is_refused_not_run_unconfined(py: Py) -> None:
    r = py.serve(request(EXECUTE, code="open('/tmp/should-not-exist', 'w')"),
                 request("execute_python", code="1"), request(INSTALL, package="tinypkg"),
                 request(LIST), env={"MACHINA_TOOLHOST_NO_LANDLOCK": "1"})
    # The code runner's own answer, a failed run with the reason and advice (its callers read
    # that shape; a host error would make them raise), in either name's shape.
    for answer in r[:2]:
        o = output(answer)
        assert o["success"] is False and o["error"].startswith("RuntimeNotReady: ") and "needs Landlock" in o["error"]
        assert "Nothing was run" in o["advice"] and o["stdout"] == "" and "executionTime" in o
    refused(r[2], "system_error", "needs Landlock")  # pip is not run unconfined
    # The interpreter's own packages are still listed (read without its site initialisation).
    listed = output(r[3])
    assert listed["success"] is True and listed["environment"] is None and listed["packages"]
    assert all(p["installed"] is False and p["name"] for p in listed["packages"])
    assert not list(py.pyws.iterdir())  # nothing was made ready
    assert not Path("/tmp/should-not-exist").exists()


# --- transports, policy -----------------------------------------------------------------------


def test_through_inprocess_and_pool(py: Py, confined: None) -> None:
    policy = py.policy()
    code = "import sys\nprint('out')\nsys.version_info[0] * 10"
    with md.InProcess(packs=["python"], policy=policy) as local:
        a = local.call(EXECUTE, {"code": code, "session_id": "t"})
        b = local.call("execute_python", {"code": "x = 3"})
        c = local.call(EXECUTE, {"code": "raise KeyError('k')"})
    with md.Pool(args=["--policy", str(policy), "--packs", "python"], env=base_env(py.env())) as pool:
        d = pool.call(EXECUTE, {"code": code, "session_id": "t"})
        e = pool.call("tools.python.execute", {"code": "x = 3"})
        f = pool.call(EXECUTE, {"code": "raise KeyError('k')"})
    for one, other in ((a, d), (b, e), (c, f)):
        x, y = dict(one.output), dict(other.output)
        for k in ("executionTime", "duration_ms"):
            x.pop(k, None)
            y.pop(k, None)
        assert x == y, (x, y)
    assert a.output["result"] == 30 and a.output["stdout"] == "out\n" and a.output["session_new"] is True
    assert set(b.output) == SERVICE_SUCCESS_FIELDS
    assert c.output["error"] == "KeyError: 'k'" and c.output["success"] is False


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[python]\ntimeout_ms = 0\n", "[python]: field 'timeout_ms': must be from 1"),
        ("[python]\nmax_output_bytes = 1000000\n", "field 'max_output_bytes': must be from 0 to 262144"),
        ("[python]\nread_paths = ['usr']\n", "field 'read_paths': 'usr' is not an absolute path"),
        ("[python]\nindex_url = 'ftp://x'\n", "field 'index_url': must be an http:// or https:// URL"),
        ("[python]\nfind_links = ['file:///x']\n", "field 'find_links': 'file:///x' is neither a folder nor"),
        ("[python]\nallow = ['']\n", "field 'allow': a package name (or glob) must not be empty"),
        ("[python]\nworkerz = 2\n", "[python]: unknown field 'workerz'"),
    ],
)
def test_a_bad_python_policy_stops_the_host(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    proc = subprocess.run([TOOLHOST, "--serve", "--policy", str(path)], input=b"", capture_output=True,
                          env=base_env({"MACHINA_TOOLHOST_WORKSPACE": str(tmp_path)}), timeout=30)
    assert proc.returncode == 2 and message in proc.stderr.decode(), proc.stderr


def test_bad_inputs_are_refused(py: Py) -> None:
    py.settings.update(max_install_packages=2)
    r = py.serve(request(EXECUTE, code="1", install_packages=["a", "b", "c"]),
                 {"aid": "execute_python", "input_json": json.dumps({"code": 5})},
                 {"aid": "execute_python", "input_json": json.dumps({"code": "1", "install_packages": "numpy"})},
                 {"aid": "execute_python", "input_json": json.dumps({"code": "1", "sync_workspace": "yes"})},
                 {"aid": "execute_python", "input_json": json.dumps({"code": "1", "session_id": ""})},
                 {"aid": "install_python_package", "input_json": json.dumps({"package": ""})},
                 {"aid": EXECUTE, "input_json": json.dumps({"code": "1", "surprise": True})},
                 {"aid": EXECUTE, "input_json": "{}"})
    refused(r[0], "invalid_input", "at most 2 packages")
    assert [x["code"] for x in r[1:4]] == ["schema_violation"] * 3, r[1:4]  # (the schema's types)
    refused(r[4], "invalid_input", "session_id must be")
    refused(r[5], "invalid_input", "package must be")
    assert [x["code"] for x in r[6:]] == ["schema_violation", "schema_violation"], r[6:]
