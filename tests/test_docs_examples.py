"""Every fenced ```bash / ```sh / ```console / ```python example of README.md and docs/*.md
runs as written from the root of a fresh clone, or says in the Markdown why it is not run
(`<!-- not run: REASON -->` on the line right before the fence).

The examples run in one temporary folder holding a copy of the repository's files they use
(README.md, docs/, examples/, tests/plugins/), never in the checkout, with the venv's bin
first on PATH and HOME, the XDG folders (the lease ledger's among them) and
MACHINA_TOOLHOST_WORKSPACE in tmp.

- ```bash / ```sh: the block runs under `set -e -o pipefail` and exits 0. A line whose
  comment says it runs "until stopped" is started on its own, must print a line saying it is
  serving, and is then stopped (a fixed `127.0.0.1:PORT` becomes a free port, so that runs at
  the same time do not collide).
- ```console: `$ ` lines are commands (with their heredocs, quoted newlines and `\\` lines),
  the lines after one are what it prints (stdout and stderr; `…` stands for any text). Every
  command exits 0: a doc that shows a failing command shows its status with
  `; echo "exit=$?"`.
- ```python: the block runs in a fresh interpreter and exits 0; a print's `# comment` (on its
  line, or the line right after it) is what it prints (`…` stands for any text).
"""

from __future__ import annotations

import os
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO, SANITIZED, base_env

# The examples build plugins with the plain compiler as a reader would: not in the sanitizer
# run, whose environment (the preloaded runtime, clang) is not a reader's.
pytestmark = pytest.mark.skipif(SANITIZED, reason="the docs' examples are run by the normal suite")

RUN_LANGS = {"bash", "sh", "console", "python"}
MIRRORED = ["README.md", "docs", "examples", "tests/plugins", "tests/packs"]
NOT_RUN = re.compile(r"^<!--\s*not run\b:?(.*?)-->$")
FENCE = re.compile(r"^```(\S*)\s*$")
BLOCK_TIMEOUT = 60
INCLUDE = "-DMACHINA_PLUGIN_INCLUDE=\"$(python3 -c 'import machina_dispatch; print(machina_dispatch.get_include())')\""
# Built once for the module, by the commands docs/plugins.md shows, so that any one example
# that uses a plugin runs on its own too.
PREBUILD = [
    f"cmake -S docs/example_plugin -B build/example-plugin {INCLUDE} && cmake --build build/example-plugin",
    f"cmake -S tests/plugins -B build/test-plugins {INCLUDE} && cmake --build build/test-plugins --target c_tools "
    "wrong_abi_version missing_version missing_register bad_tier bad_schema",
]
# What an example must not do to the machine it runs on unless it is marked not run.
INSTALLS = re.compile(r"\b(pip install|apt-get|apt install|install-system-deps)\b")


@dataclass(frozen=True)
class Block:
    doc: str   # path relative to the repository
    line: int  # the fence's line, 1-based
    lang: str
    text: str
    not_run: str | None  # the marker's reason ("" when it gives none), None when unmarked

    @property
    def name(self) -> str:
        return f"{self.doc}:{self.line}"


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def fenced_blocks(path: Path) -> list[Block]:
    lines = path.read_text().split("\n")
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        prev = lines[i - 1].strip() if i > 0 else ""
        marker = NOT_RUN.match(prev)
        out.append(Block(str(path.relative_to(REPO)), i + 1, m.group(1), "\n".join(lines[i + 1:end]) + "\n",
                         marker.group(1).strip() if marker else None))
        i = end + 1
    return out


ALL_BLOCKS = [b for doc in documents() for b in fenced_blocks(doc)]
RUNNABLE = [b for b in ALL_BLOCKS if b.lang in RUN_LANGS]


# --- the folder the examples run in ---------------------------------------------------------

@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("docs-examples")
    clone = root / "clone"
    clone.mkdir()
    for rel in MIRRORED:
        src = REPO / rel
        if src.is_dir():
            shutil.copytree(src, clone / rel, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            shutil.copy2(src, clone / rel)
    for d in ("home", "xdg-config", "xdg-cache", "xdg-data", "xdg-state", "xdg-runtime", "workspace", "tmp"):
        (root / d).mkdir(mode=0o700)
    env = base_env({
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(root / "home"),
        "XDG_CONFIG_HOME": str(root / "xdg-config"),
        "XDG_CACHE_HOME": str(root / "xdg-cache"),
        "XDG_DATA_HOME": str(root / "xdg-data"),
        "XDG_STATE_HOME": str(root / "xdg-state"),
        "XDG_RUNTIME_DIR": str(root / "xdg-runtime"),  # the lease ledger's default folder
        "MACHINA_TOOLHOST_WORKSPACE": str(root / "workspace"),
        "TMPDIR": str(root / "tmp"),
        "PYTHONDONTWRITEBYTECODE": "1",
    })
    env.pop("VIRTUAL_ENV", None)
    for command in PREBUILD:
        proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", command], cwd=clone, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return clone, env


# --- the markers ----------------------------------------------------------------------------

def test_the_docs_have_runnable_examples() -> None:
    run = [b for b in RUNNABLE if b.not_run is None]
    assert len(run) >= 40, [b.name for b in run]
    assert {b.doc for b in run} >= {"README.md", "docs/protocol.md", "docs/python.md", "docs/plugins.md"}


def test_every_not_run_marker_gives_a_reason() -> None:
    bare = [b.name for b in ALL_BLOCKS if b.not_run == ""]
    assert not bare, f"<!-- not run: REASON --> needs its reason: {bare}"


def test_the_plugin_builds_are_the_docs_own() -> None:
    plugins_md = (REPO / "docs" / "plugins.md").read_text()
    for command in PREBUILD:
        assert command in plugins_md, command


def test_examples_that_install_are_marked_not_run() -> None:
    """The test runs examples with this venv's pip: one that installs would change it."""
    unmarked = [b.name for b in RUNNABLE if b.not_run is None and INSTALLS.search(b.text)]
    assert not unmarked, f"mark these <!-- not run: REASON -->: {unmarked}"


def test_shell_sessions_are_tagged_console() -> None:
    """A block showing `$ command` lines without a language would escape this test."""
    untagged = [b.name for b in ALL_BLOCKS if b.lang not in RUN_LANGS and b.text.startswith("$ ")]
    assert not untagged, f"tag these ```console: {untagged}"


# --- running ---------------------------------------------------------------------------------

def matches(expected: list[str], actual: list[str]) -> bool:
    if len(expected) != len(actual):
        return False
    for e, a in zip(expected, actual, strict=True):
        pattern = ".*".join(re.escape(part) for part in e.split("…"))
        if not re.fullmatch(pattern, a, flags=re.S):
            return False
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_until_stopped(command: str, cwd: Path, env: dict[str, str]) -> None:
    """Starts a server line, waits for the line saying it serves, and stops it."""
    command = re.sub(r"127\.0\.0\.1:\d+", f"127.0.0.1:{free_port()}", command)
    proc = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    assert proc.stdout is not None
    printed = b""
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 0.1)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                printed += chunk
                if b"serving" in printed:
                    return
        pytest.fail(f"{command!r} did not say it is serving (exit {proc.poll()}): {printed.decode(errors='replace')}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        assert proc.returncode is not None


def run_script(script: str, cwd: Path, env: dict[str, str], what: str) -> str:
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=cwd, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=BLOCK_TIMEOUT)
    assert proc.returncode == 0, f"{what}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def run_bash(block: Block, cwd: Path, env: dict[str, str]) -> None:
    pending: list[str] = []
    for line in block.text.splitlines():
        if "until stopped" in line.partition("#")[2]:
            if pending:
                run_script("\n".join(pending), cwd, env, block.name)
                pending = []
            run_until_stopped(line, cwd, env)
        else:
            pending.append(line)
    if any(p.strip() and not p.lstrip().startswith("#") for p in pending):
        run_script("\n".join(pending), cwd, env, block.name)


HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")


def console_steps(text: str) -> list[tuple[str, list[str]]]:
    """The (command, expected output lines) of a console block."""
    lines = text.splitlines()
    steps: list[tuple[str, list[str]]] = []
    i = 0
    while i < len(lines):
        assert lines[i].startswith("$ "), f"a console block starts each command with '$ ': {lines[i]!r}"
        command = [lines[i][2:]]
        i += 1
        while True:
            joined = "\n".join(command)
            if joined.endswith("\\"):
                command.append(lines[i])
                i += 1
                continue
            try:
                shlex.split(joined, comments=True)
            except ValueError:  # a quote still open: the command goes on
                command.append(lines[i])
                i += 1
                continue
            break
        heredoc = HEREDOC.search("\n".join(command))
        if heredoc:
            while lines[i] != heredoc.group(2):
                command.append(lines[i])
                i += 1
            command.append(lines[i])
            i += 1
        output: list[str] = []
        while i < len(lines) and not lines[i].startswith("$ "):
            output.append(lines[i])
            i += 1
        steps.append(("\n".join(command), output))
    return steps


def run_console(block: Block, cwd: Path, env: dict[str, str]) -> None:
    steps = console_steps(block.text)
    script = ["exec 2>&1"]
    for command, _ in steps:
        script += [command, "printf '\\036%d\\n' \"$?\""]
    proc = subprocess.run(["bash", "-c", "\n".join(script)], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=BLOCK_TIMEOUT)
    parts = re.split(r"\x1e(\d+)\n", proc.stdout)
    assert len(parts) == 2 * len(steps) + 1, f"{block.name}: the session stopped early:\n{proc.stdout}"
    for k, (command, expected) in enumerate(steps):
        printed, status = parts[2 * k].splitlines(), int(parts[2 * k + 1])
        assert status == 0, f"{block.name}: `{command}` exited {status}:\n{parts[2 * k]}"
        assert matches(expected, printed), (
            f"{block.name}: `{command}` printed\n" + "\n".join(printed) + "\nwhere the doc shows\n"
            + "\n".join(expected))


def python_expected_output(code: str) -> list[str]:
    """The comments that state what each print shows: on the print's own line, or the
    comment line right after it."""
    lines = code.splitlines()
    out: list[str] = []
    for i, line in enumerate(lines):
        if not line.lstrip().startswith("print("):
            continue
        if "  # " in line:
            out.append(line.split("  # ", 1)[1].strip())
        elif i + 1 < len(lines) and lines[i + 1].startswith("# "):
            out.append(lines[i + 1][2:])
    return out


def run_python(block: Block, cwd: Path, env: dict[str, str]) -> None:
    proc = subprocess.run([sys.executable, "-c", block.text], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=BLOCK_TIMEOUT)
    assert proc.returncode == 0, f"{block.name}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    expected = python_expected_output(block.text)
    if expected:
        printed = proc.stdout.rstrip("\n").splitlines()
        assert matches(expected, printed), (
            f"{block.name} printed\n{proc.stdout}where the doc shows\n" + "\n".join(expected))


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.name for b in RUNNABLE])
def test_example_runs_as_written(block: Block, sandbox: tuple[Path, dict[str, str]]) -> None:
    if block.not_run is not None:
        pytest.skip(f"marked not run: {block.not_run}")
    assert not INSTALLS.search(block.text), f"{block.name} installs: mark it not run"
    cwd, env = sandbox
    if block.lang == "python":
        run_python(block, cwd, env)
    elif block.lang == "console":
        run_console(block, cwd, env)
    else:
        run_bash(block, cwd, env)

