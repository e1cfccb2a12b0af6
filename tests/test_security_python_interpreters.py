"""Warm Python interpreters carry nothing from one caller to another (security issue 32,
items 5 and 6): execute_python without a session runs each call in an interpreter that ran
no other code; a session belongs to one user; a manifest Python tool's worker serves one
user; and a thread the interpreter does not know of (pthread_create through ctypes) never
outlives its call, in execute_python and in a manifest Python tool."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import TOOLHOST, base_env
from python_support import call, python_tool, write_pack
from test_python_exec import EXECUTE, Py, code_failed, output

# A C thread: pthread_create through ctypes, its body a Python callback that appends to
# PATH every 20 ms, for ever. The interpreter's own thread count does not see it.
C_THREAD = textwrap.dedent("""
    import ctypes, time
    def _tick(_):
        while True:
            with open(PATH, "a") as f:
                f.write("x")
            time.sleep(0.02)
        return 0
    _BODY = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(_tick)
    _libc = ctypes.CDLL(None)
    _tid = ctypes.c_ulong()
    assert _libc.pthread_create(ctypes.byref(_tid), None, _BODY, None) == 0
    import builtins
    builtins._machina_c_thread = _BODY  # (kept alive)
""")

# What a hostile caller leaves behind in its interpreter: the runner's entry replaced (the
# next caller's code copied into its output, its result replaced), builtins patched, an
# audit hook (which cannot be removed), a profile hook and a module attribute.
HOOKS = textwrap.dedent("""
    import builtins, sys
    runner = sys.modules["machina_python_exec"]
    entry = runner.execute
    def hooked(payload):
        answer = entry(payload)
        answer["stdout"] = "LOGGED: " + payload["code"]
        answer["result"] = "owned"
        return answer
    runner.execute = hooked
    builtins.abs = lambda x: 42
    builtins.marker_of_a = "a was here"
    sys.addaudithook(lambda event, args: event == "exec" and print("AUDIT", file=sys.__stderr__))
    sys.setprofile(lambda *a: None)
    import json
    json.marker_of_a = True
    "planted"
""")

VICTIM = ("import builtins, json, sys\n"
          "[abs(-3), hasattr(builtins, 'marker_of_a'), hasattr(json, 'marker_of_a'), "
          "sys.getprofile() is None]")


@pytest.fixture
def py(tmp_path: Path, no_orphans: None) -> Py:
    return Py(tmp_path)


@pytest.fixture(scope="module")
def confined(tmp_path_factory: pytest.TempPathFactory) -> None:
    from conftest import skip_where_unconfinable

    probe = Py(tmp_path_factory.mktemp("probe"))
    r = probe.call(EXECUTE, code="1")
    skip_where_unconfinable([r])
    assert output(r)["result"] == 1, r


def unaffected(o: dict[str, Any]) -> None:
    assert o["success"] is True, o
    assert o["result"] == [3, False, False, True], o
    assert "LOGGED" not in o["stdout"] and "AUDIT" not in o["stderr"], o


def test_a_callers_hooks_never_reach_the_next_callers_code(py: Py, confined: None) -> None:
    py.settings.update(workers=1)  # one interpreter at a time: the next call would get the same one
    with py.host() as h:
        assert h.run(HOOKS, user="mallory")["result"] == "planted"
        unaffected(h.run(VICTIM, user="bob"))
        # The same user's next call gets a fresh interpreter too.
        assert h.run(HOOKS, user="mallory")["result"] == "planted"
        unaffected(h.run(VICTIM, user="mallory"))


def test_a_session_belongs_to_its_user(py: Py, confined: None) -> None:
    with py.host() as h:
        assert h.run("secret = 'mallory'\n" + HOOKS, user="mallory", session_id="s")["result"] == "planted"
        o = h.run("secret", user="bob", session_id="s")
        code_failed(o, "NameError")
        assert o["session_new"] is True
        assert h.run("secret", user="mallory", session_id="s")["result"] == "owned"  # (its own hooks)


def c_thread_code(path: Path) -> str:
    return f"PATH = {str(path)!r}\n" + C_THREAD + "\n'started'"


def still_growing(path: Path) -> bool:
    """Whether something still appends to `path` (0.3 s apart)."""
    time.sleep(0.3)
    before = path.stat().st_size if path.exists() else -1
    time.sleep(0.3)
    after = path.stat().st_size if path.exists() else -1
    return after > before


def test_a_c_thread_does_not_outlive_its_execute_python_call(py: Py, confined: None) -> None:
    py.settings.update(workers=1)
    with py.host() as h:
        # The call folders' parent is writable to the code: the thread writes there.
        first = h.run("import os\nos.path.dirname(os.getcwd())")
        tick = Path(first["result"]) / "tick"
        assert h.run(c_thread_code(tick))["result"] == "started"
        assert not still_growing(tick)


def test_a_c_thread_ends_a_session(py: Py, confined: None) -> None:
    with py.host() as h:
        where = h.run("import os\nos.getcwd()", session_id="t")["result"]
        tick = Path(where) / "tick"
        o = h.run(c_thread_code(tick), session_id="t")
        assert o["result"] == "started" and o["session_ended"] is True, o
        assert not still_growing(tick)
        assert h.run("1", session_id="t")["session_new"] is True


# --- manifest Python tools ------------------------------------------------------------------

TOOL_MODULE = textwrap.dedent('''
    """Tools of the security tests: one runs the caller's code (as a tool that evaluates
    what it is given would), one reports what an interpreter carries."""
    import builtins, os, uuid

    INTERPRETER = str(uuid.uuid4())  # (a pid may repeat in a sandbox's own pid namespace)


    def run(payload):
        exec(payload.get("code", ""), {"__name__": "caller"})
        return {"pid": INTERPRETER}


    def seen(payload):
        return {"pid": INTERPRETER, "marker": getattr(builtins, "marker_of_a", None),
                "threads": len(os.listdir("/proc/self/task"))}
''')


def manifest(folder: Path, **fields: Any) -> Path:
    path = write_pack(folder, [python_tool("AID.SEC.RUN.v1", "tools.caller_code:run", python=sys.executable, **fields),
                               python_tool("AID.SEC.SEEN.v1", "tools.caller_code:seen", python=sys.executable,
                                           **fields)])
    (folder / "tools" / "caller_code.py").write_text(TOOL_MODULE)
    return path


def serve_lines(manifest_path: Path, requests: list[dict[str, Any]], pause_after: int = -1,
                pause_s: float = 0.0) -> list[dict[str, Any]]:
    """The requests through one --serve host with one Python worker, one at a time."""
    host = subprocess.Popen([TOOLHOST, "--serve", "--tools", str(manifest_path), "--python-workers", "1"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=base_env())
    assert host.stdin is not None and host.stdout is not None
    answers = []
    try:
        for i, r in enumerate(requests):
            host.stdin.write(json.dumps({**r, "id": i}).encode() + b"\n")
            host.stdin.flush()
            answers.append(json.loads(host.stdout.readline()))
            if i == pause_after:
                time.sleep(pause_s)
    finally:
        host.stdin.close()
        host.wait(timeout=30)
        host.stdout.close()
        assert host.stderr is not None
        host.stderr.close()
    return answers


def result(r: dict[str, Any]) -> Any:
    assert r["ok"], r
    return json.loads(r["output_json"])


def test_a_tool_worker_serves_one_user(tmp_path: Path, no_orphans: None) -> None:
    path = manifest(tmp_path / "pack")
    plant = "import builtins\nbuiltins.marker_of_a = 'a was here'"
    a1, a2, b, a3 = serve_lines(path, [
        call("AID.SEC.RUN.v1", {"code": plant}, user="mallory"),
        call("AID.SEC.SEEN.v1", {}, user="mallory"),
        call("AID.SEC.SEEN.v1", {}, user="bob"),
        call("AID.SEC.SEEN.v1", {}, user="mallory"),
    ])
    assert result(a2)["marker"] == "a was here" and result(a2)["pid"] == result(a1)["pid"]  # warm for its user
    assert result(b)["marker"] is None and result(b)["pid"] != result(a1)["pid"]
    assert result(a3)["marker"] is None  # (its worker was ended to make room for bob's)


@pytest.mark.parametrize("sandbox", [False, True])
def test_a_c_thread_does_not_outlive_its_tool_call(tmp_path: Path, no_orphans: None, sandbox: bool) -> None:
    fields = {"sandbox": True} if sandbox else {}
    path = manifest(tmp_path / "pack", **fields)
    tick = tmp_path / "tick"
    code = f"PATH = {str(tick)!r}\n" + C_THREAD
    if sandbox:  # (nothing is writable in the walls: the thread only counts)
        code = code.replace('with open(PATH, "a") as f:\n            f.write("x")', "pass")
    started, after = serve_lines(path, [call("AID.SEC.RUN.v1", {"code": code}),
                                        call("AID.SEC.SEEN.v1", {})], pause_after=0, pause_s=0.2)
    assert result(started)["pid"] != result(after)["pid"]  # its worker was retired
    assert result(after)["threads"] == 1
    if not sandbox:
        assert not still_growing(tick)


def test_a_call_changes_nothing_beside_its_own_folder(py: Py, confined: None) -> None:
    # Two calls at once: the first looks for the other's folder beside its own and plants a
    # module there (a call's folder is its working directory and first import path).
    py.settings.update(workers=2)
    plant = textwrap.dedent("""
        import os, time
        mine = os.path.basename(os.getcwd())
        planted, refused = [], []
        end = time.monotonic() + 3
        while time.monotonic() < end and not planted:
            for name in os.listdir(".."):
                if name != mine:
                    try:
                        with open(os.path.join("..", name, "evil_mod.py"), "w") as f:
                            f.write("OWNED = True")
                        planted.append(name)
                    except OSError as e:
                        refused.append(type(e).__name__)
            time.sleep(0.02)
        for attempt in (lambda: open("../beside.txt", "w"), lambda: os.mkdir("../beside")):
            try:
                attempt()
                planted.append("beside")
            except OSError as e:
                refused.append(type(e).__name__)
        [planted, sorted(set(refused))]
    """)
    with py.host() as h:
        first = h.send(EXECUTE, user="mallory", code=plant)
        time.sleep(0.3)
        victim = h.run("import time\ntime.sleep(1.5)\ntry:\n    import evil_mod\n    owned = True\n"
                       "except ImportError:\n    owned = False\nowned", user="bob")
        planted = output(h.answer(first))
        assert victim["result"] is False, (victim, planted)
        assert planted["result"] == [[], ["PermissionError"]], planted
        # Its own folder stays writable.
        assert h.run("open('mine.txt', 'w').write('x')")["result"] == 1
