"""Replays the protocol transcripts in tests/transcripts through every front.

A transcript is an NDJSON file. An optional first line names the session's set-up:
``{"env": {...}, "args": [...], "plugins": ["misbehaving_tools"]}``; every other line is
``{"request": <line as a string, or an object sent as json.dumps(object)>,
"response": <the exact expected response, or null when none is expected>}``.
A transcript's requests form one session, sent in order:

(a) as lines to one ``machina-toolhost --serve`` process;
(b) in-process, one ``machina_dispatch.Host`` and one ``Session`` per transcript, one
    ``call_json`` per non-blank request.

Each replay gets a private, empty lease ledger (``MACHINA_LEASE_LEDGER``) unless the
transcript names one, so replays never touch the per-user default ledger. Transcripts hold
no valid lease that a replay could use up: with a ledger shared between runs, a single-use
lease in a static file would be refused as ``consumed`` on the next run.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import machina_dispatch
import pytest
from conftest import TRANSCRIPTS, serve_raw

Response = dict[str, Any]

TRANSCRIPT_FILES = sorted(TRANSCRIPTS.glob("*.ndjson"))
EXPECTED_FILES = {"basics", "errors", "ds_state", "idempotency", "leases"}
HEADER_KEYS = {"env", "args", "plugins"}

# Command-line options a transcript may set, and the Host keyword each one maps to.
HOST_OPTIONS = {
    "--max-request-bytes": "max_request_bytes",
    "--max-output-bytes": "max_output_bytes",
    "--idempotency-ttl-ms": "idempotency_ttl_ms",
    "--idempotency-max-entries": "idempotency_max_entries",
    "--breaker-threshold": "breaker_threshold",
    "--breaker-window-ms": "breaker_window_ms",
    "--breaker-cooldown-ms": "breaker_cooldown_ms",
}


@dataclass(frozen=True)
class Step:
    number: int  # line number in the file, for messages
    line: str  # the request line, without the newline
    expected: Response | None

    @property
    def blank(self) -> bool:
        return self.line.strip(" \t\r") == ""


@dataclass
class Transcript:
    name: str
    env: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    plugins: list[str] | None = None  # None: the built-in pack only
    steps: list[Step] = field(default_factory=list)

    @property
    def expected(self) -> list[tuple[str, Response]]:
        """The responses expected on the wire, each with a label naming its request."""
        return [(f"{self.name}:{s.number} {s.line[:120]!r}", s.expected)
                for s in self.steps if s.expected is not None]

    def environment(self, ledger: Path) -> dict[str, str]:
        return {"MACHINA_LEASE_LEDGER": str(ledger), **self.env}

    def host_options(self) -> dict[str, int]:
        if len(self.args) % 2 != 0:
            raise ValueError(f"{self.name}: args must be option/value pairs: {self.args}")
        options: dict[str, int] = {}
        for opt, value in zip(self.args[::2], self.args[1::2], strict=True):
            if opt not in HOST_OPTIONS:
                raise ValueError(f"{self.name}: option {opt} has no in-process equivalent")
            options[HOST_OPTIONS[opt]] = int(value)
        return options


def load_transcript(path: Path) -> Transcript:
    transcript = Transcript(path.stem)
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, text in enumerate(lines, start=1):
        entry = json.loads(text)
        assert isinstance(entry, dict), f"{path.name}:{number}: not an object"
        if number == 1 and "request" not in entry:
            assert set(entry) <= HEADER_KEYS, f"{path.name}: unknown header keys {set(entry)}"
            transcript.env = dict(entry.get("env", {}))
            transcript.args = [str(a) for a in entry.get("args", [])]
            plugins = entry.get("plugins")
            transcript.plugins = None if plugins is None else [str(p) for p in plugins]
            continue
        assert set(entry) == {"request", "response"}, f"{path.name}:{number}: {set(entry)}"
        request = entry["request"]
        line = request if isinstance(request, str) else json.dumps(request)
        assert "\n" not in line, f"{path.name}:{number}: a request is one line"
        step = Step(number, line, entry["response"])
        assert step.blank == (step.expected is None), (
            f"{path.name}:{number}: exactly the blank requests expect no response")
        transcript.steps.append(step)
    assert transcript.steps, f"{path.name}: no requests"
    return transcript


def parse_response(text: str) -> Response:
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in pairs]
        assert len(keys) == len(set(keys)), f"duplicate keys in {text[:200]}"
        return dict(pairs)

    def no_constants(name: str) -> Any:
        raise AssertionError(f"non-JSON constant {name} in {text[:200]}")

    value = json.loads(text, object_pairs_hook=no_duplicates, parse_constant=no_constants)
    assert isinstance(value, dict), text[:200]
    return value


def serve_lines(stdout: bytes) -> list[str]:
    if not stdout:
        return []
    assert stdout.endswith(b"\n"), "the last response line is not terminated"
    return [raw.decode("utf-8") for raw in stdout.split(b"\n")[:-1]]  # strict UTF-8


def assert_responses(got: list[str], transcript: Transcript) -> None:
    expected = transcript.expected
    for text, (label, want) in zip(got, expected, strict=True):
        assert parse_response(text) == want, label
    assert len(got) == len(expected), (
        f"{transcript.name}: {len(got)} responses for {len(expected)} requests")


# --- the fronts -------------------------------------------------------------------------


def replay_serve(transcript: Transcript, test_plugins: dict[str, str], tmp_path: Path) -> list[str]:
    args = list(transcript.args)
    if transcript.plugins is not None:
        for path in [str(machina_dispatch.builtin_plugin_path()),
                     *(test_plugins[name] for name in transcript.plugins)]:
            args += ["--plugin", path]
        args += ["--packs", "files,shell"]  # (what a host without plugins named serves)
    data = "".join(step.line + "\n" for step in transcript.steps).encode()
    proc = serve_raw(data, *args, env=transcript.environment(tmp_path / "serve-ledger"))
    assert proc.returncode == 0, proc.stderr
    return serve_lines(proc.stdout)


def replay_in_process(transcript: Transcript, test_plugins: dict[str, str], tmp_path: Path,
                      monkeypatch: pytest.MonkeyPatch) -> list[str]:
    for key in list(os.environ):
        if key.startswith("MACHINA_"):
            monkeypatch.delenv(key)
    for key, value in transcript.environment(tmp_path / "in-process-ledger").items():
        monkeypatch.setenv(key, value)  # read when the Host is constructed
    plugins: list[str | Path] | None = None
    if transcript.plugins is not None:
        plugins = [str(machina_dispatch.builtin_plugin_path())]
        for name in transcript.plugins:
            # A private copy is loaded as a separate library, so its globals (such as
            # AID.TEST.COUNTER.v1's count) start fresh as they do in a new process.
            private = tmp_path / f"{name}-{transcript.name}.so"
            shutil.copyfile(test_plugins[name], private)
            plugins.append(str(private))
    host = machina_dispatch.Host(plugins=plugins, **transcript.host_options())
    if plugins is not None:
        host.add_packs()
    session = machina_dispatch.Session()
    return [host.call_json(step.line, session) for step in transcript.steps if not step.blank]


# --- tests --------------------------------------------------------------------------------


def transcripts() -> list[Any]:
    return [pytest.param(path, id=path.stem) for path in TRANSCRIPT_FILES]


def test_transcript_set_is_complete() -> None:
    assert EXPECTED_FILES <= {p.stem for p in TRANSCRIPT_FILES}
    for path in TRANSCRIPT_FILES:
        load_transcript(path)


@pytest.mark.parametrize("path", transcripts())
def test_transcript_serve(path: Path, test_plugins: dict[str, str], tmp_path: Path) -> None:
    transcript = load_transcript(path)
    assert_responses(replay_serve(transcript, test_plugins, tmp_path), transcript)


@pytest.mark.parametrize("path", transcripts())
def test_transcript_in_process(path: Path, test_plugins: dict[str, str], tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    transcript = load_transcript(path)
    assert_responses(replay_in_process(transcript, test_plugins, tmp_path, monkeypatch),
                     transcript)


@pytest.mark.parametrize("path", transcripts())
def test_fronts_answer_the_same_bytes(path: Path, test_plugins: dict[str, str], tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Both fronts share one encoder: the response texts are identical, not just equal
    as JSON."""
    transcript = load_transcript(path)
    served = replay_serve(transcript, test_plugins, tmp_path)
    in_process = replay_in_process(transcript, test_plugins, tmp_path, monkeypatch)
    assert served == in_process
