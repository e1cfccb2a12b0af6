"""A skill directory's requirements.txt is installed into a virtual environment of the skill's
own before it starts (docs/mcp-and-skills.md): made once, reused while the file is unchanged,
made anew when it changes; a requirement pip cannot install refuses the skill with pip's own
words, and a skill whose command is not Python is refused. The package installed is a wheel
made here, named by path with --no-index: nothing is fetched."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import machina_dispatch as md
import pytest
from python_support import make_wheel

SKILL = textwrap.dedent("""
    import json, sys
    import machina_probe_dep

    TOOLS = [{"name": "value", "description": "The installed package's value",
              "parameters": {"type": "object", "properties": {}}}]
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message or "method" not in message:
            continue
        method = message["method"]
        if method == "initialize":
            result = {"name": "deps", "version": "1.0.0", "tools": TOOLS}
        elif method == "tools/call":
            result = {"content": machina_probe_dep.VALUE + " in " + sys.prefix}
        else:
            result = {"ok": True}
        print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}), flush=True)
        if method == "shutdown":
            break
""")


def wheel(folder: Path, value: str, version: str = "1.0") -> Path:
    """A wheel of the module machina_probe_dep, whose VALUE is `value`."""
    return make_wheel(folder, "machina_probe_dep", version, {"machina_probe_dep.py": f"VALUE = {value!r}\n"})


def skill_dir(tmp_path: Path, requirements: str, command: str = "python3") -> Path:
    folder = tmp_path / "deps"
    (folder / "wheels").mkdir(parents=True)
    (folder / "skill.py").write_text(SKILL)
    (folder / "SKILL.md").write_text("---\nname: deps\ndescription: A skill that needs a package\n---\n")
    (folder / "manifest.json").write_text(json.dumps({"runtime": {"type": "subprocess", "command": command,
                                                                  "args": ["skill.py"]}}))
    (folder / "requirements.txt").write_text(requirements)
    return folder


def environments(state: Path) -> list[Path]:
    root = state / "machina-toolhost" / "skill-envs"
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(folder))
    return folder


def started(folder: Path) -> md.Skill:
    """The skill started, or the test skipped where this kernel cannot build pip's walls."""
    try:
        return md.Skill(folder)
    except md.HostError as e:
        if "could not be confined" in str(e):
            pytest.skip(str(e))
        raise


def test_requirements_are_installed_once_and_made_anew_when_they_change(tmp_path: Path, state: Path) -> None:
    folder = skill_dir(tmp_path, "--no-index\n./wheels/machina_probe_dep-1.0-py3-none-any.whl\n")
    wheel(folder / "wheels", "first")
    with started(folder) as t:
        answer = t.call("value").output_json
    [env] = environments(state)
    assert json.loads(answer).startswith("first in " + str(env)), answer
    # Made in place: its scripts name the interpreter of the folder they are in.
    head = (env / "bin" / "pip").read_text()[:500]
    assert f"{env}/bin/python" in head, head
    made = (env / ".machina-ready").stat().st_mtime_ns
    with md.Skill(folder) as t:  # the same file: the same environment, not made again
        assert json.loads(t.call("value").output_json).startswith("first in " + str(env))
    assert environments(state) == [env] and (env / ".machina-ready").stat().st_mtime_ns == made
    # A changed file: a new environment beside the first.
    wheel(folder / "wheels", "second", version="2.0")
    (folder / "requirements.txt").write_text("--no-index\n./wheels/machina_probe_dep-2.0-py3-none-any.whl\n")
    with md.Skill(folder) as t:
        assert json.loads(t.call("value").output_json).startswith("second in ")
    assert len(environments(state)) == 2


def test_a_requirement_pip_cannot_install_refuses_the_skill_with_pips_words(tmp_path: Path, state: Path) -> None:
    folder = skill_dir(tmp_path, "--no-index\nmachina-no-such-package-anywhere==9.9\n")
    with pytest.raises(md.HostError) as refused:
        md.Skill(folder)
    if "could not be confined" in str(refused.value):
        pytest.skip(str(refused.value))
    assert re.search(r"requirements\.txt: pip .*machina-no-such-package-anywhere", str(refused.value)), refused.value
    assert environments(state) == []  # nothing half made is left


def test_a_skill_that_is_not_python_is_refused(tmp_path: Path, state: Path) -> None:
    folder = skill_dir(tmp_path, "anything\n", command="sh")
    with pytest.raises(md.HostError, match=r"requirements\.txt needs a Python skill"):
        md.Skill(folder)
