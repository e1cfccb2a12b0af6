"""scripts/commit-msg, the hook install.sh puts in .git/hooks: a subject of at most 72
characters, then a blank line. Run on message files, inside a real `git commit`, and over
this checkout's history since the last commit whose subject did not fit."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

HOOK = REPO / "scripts" / "commit-msg"
# The newest commit with a subject over 72 characters: every later one fits.
LAST_LONG_SUBJECT = "afaa932"


def run_hook(tmp_path: Path, message: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message, encoding="utf-8")
    return subprocess.run([sys.executable, str(HOOK), str(path)], capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("message", [
    "tests: one line\n",
    "x" * 72 + "\n\nA body line that is much longer than seventy-two characters is fine: it wraps where it likes.\n",
    "é" * 72 + "\n",  # characters, not bytes
    "# a comment git strips, however long it is: " + "#" * 100 + "\nsubject\n",
    "\nsubject after a blank line git strips\n\nbody\n",
    "subject\n\nbody\n# Please enter the commit message for your changes. Lines starting\n",
])
def test_a_message_that_fits_passes(tmp_path: Path, message: str) -> None:
    proc = run_hook(tmp_path, message)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


@pytest.mark.parametrize(("message", "says"), [
    ("x" * 73 + "\n", "the subject has 73 characters; at most 72"),
    ("subject\nbody right under it\n", "the second line is not blank"),
    ("y" * 80 + "\nbody\n", "the subject has 80 characters"),
])
def test_a_message_that_does_not_fit_is_refused(tmp_path: Path, message: str, says: str) -> None:
    proc = run_hook(tmp_path, message)
    assert proc.returncode == 1 and f"commit-msg: {says}" in proc.stderr, proc.stderr


def test_git_refuses_the_commit(tmp_path: Path) -> None:
    git = shutil.which("git")
    assert git is not None, "git is needed to build from a checkout"
    repo = tmp_path / "repo"
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    shutil.copy(HOOK, hooks / "commit-msg")
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.org", "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
           "HOME": str(tmp_path)}

    def git_run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([git, "-C", str(repo), *args], capture_output=True, text=True, env=env, timeout=30)

    subprocess.run([git, "init", "-q", str(repo)], check=True, env=env, timeout=30)
    assert git_run("config", "core.hooksPath", str(hooks)).returncode == 0
    refused = git_run("commit", "-q", "--allow-empty", "-m", "z" * 90)
    assert refused.returncode != 0 and "the subject has 90 characters" in refused.stderr, refused.stderr
    taken = git_run("commit", "-q", "--allow-empty", "-m", "a short subject", "-m", "and a body")
    assert taken.returncode == 0, taken.stderr
    assert git_run("log", "--format=%s").stdout.splitlines() == ["a short subject"]


def test_install_sh_puts_the_hook_into_a_checkout(tmp_path: Path) -> None:
    """install.sh's own line, run in a fresh checkout and outside any: the hook lands in the
    first (as it is, executable) and the second is left alone."""
    line = next(text for text in (REPO / "scripts" / "install.sh").read_text().splitlines()
                if "commit-msg" in text and not text.lstrip().startswith("#"))
    git = shutil.which("git")
    assert git is not None, "git is needed to build from a checkout"
    for place, is_checkout in ((tmp_path / "checkout", True), (tmp_path / "plain", False)):
        (place / "scripts").mkdir(parents=True)
        shutil.copy(HOOK, place / "scripts" / "commit-msg")
        if is_checkout:
            subprocess.run([git, "init", "-q", str(place)], check=True, timeout=30)
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GIT_CEILING_DIRECTORIES": str(tmp_path)}
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", line], cwd=place, capture_output=True, text=True,
                              env=env, timeout=30)
        assert proc.returncode == 0, proc.stderr
        installed = place / ".git" / "hooks" / "commit-msg"
        if is_checkout:
            assert installed.read_bytes() == HOOK.read_bytes() and installed.stat().st_mode & 0o111
        else:
            assert not (place / ".git").exists()


def test_every_subject_since_the_last_long_one_fits(tmp_path: Path) -> None:
    git = shutil.which("git")
    if git is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    known = subprocess.run([git, "-C", str(REPO), "cat-file", "-e", f"{LAST_LONG_SUBJECT}^{{commit}}"],
                           capture_output=True, timeout=30)
    if known.returncode != 0:
        pytest.skip(f"{LAST_LONG_SUBJECT} is not in this clone's history (a shallow clone)")
    log = subprocess.run([git, "-C", str(REPO), "log", "--format=%h%x00%B%x01", f"{LAST_LONG_SUBJECT}..HEAD"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    bad = []
    for entry in filter(str.strip, log.split("\x01")):
        commit, _, message = entry.strip("\n").partition("\x00")
        proc = run_hook(tmp_path, message)
        if proc.returncode != 0:
            bad.append(f"{commit}: {proc.stderr.strip()}")
    assert not bad, "\n".join(bad)
