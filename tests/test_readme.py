"""The README keeps its promises to a new developer: it opens with the two set-up commands
(install and demo; install and test), CI runs exactly the second, and the documents it
points to exist."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import REPO

README = (Path(REPO) / "README.md").read_text()


def test_readme_opens_with_the_two_set_up_commands() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README, re.S)
    assert first_block is not None and README.index("```bash") < README.index("\n## ")
    commands = first_block.group(1).strip().splitlines()
    assert commands == [
        "bash scripts/install.sh && . .venv/bin/activate && bash scripts/demo.sh",
        "bash scripts/install.sh test,bench && . .venv/bin/activate && python -m pytest",
    ]
    for script in ("scripts/install.sh", "scripts/install-system-deps.sh", "scripts/demo.sh"):
        assert (Path(REPO) / script).is_file(), script


def test_ci_runs_the_readmes_test_command() -> None:
    test_command = re.search(r"```bash\n.*?\n(.*?)\n```", README, re.S)
    assert test_command is not None
    ci = (Path(REPO) / ".ci" / "run").read_text().splitlines()
    assert test_command.group(1) in ci


def test_the_documents_it_links_exist_and_python_has_a_section() -> None:
    links = set(re.findall(r"\]\((docs/[^)#]+)", README))
    assert {"docs/protocol.md", "docs/python.md", "docs/plugins.md", "docs/operations.md"} <= links
    for link in links:
        assert (Path(REPO) / link).exists(), link
    assert "\n## From Python\n" in README
