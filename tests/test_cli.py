"""The command line: modes, their argument forms, --help and --version."""

from __future__ import annotations

import json
import re
import subprocess

import machina_dispatch
import pytest
from conftest import LIST_HINT, REPO, STATIC_FRONT, TOOLHOST, base_env, ok_response, run_json

REQUIRED_TOOLS = {"AID.ECHO.v1", "AID.TEXT.STATS.v1", "AID.STATE.PUT.v1", "AID.FILE.WRITE.v1"}


def cli(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([TOOLHOST, *args], input=stdin, capture_output=True, env=base_env(), timeout=30)


def test_version_is_single_sourced() -> None:
    # [project] version, read without tomllib (Python 3.11+) since the package supports 3.10.
    found = re.search(r'^version = "([^"]+)"$', (REPO / "pyproject.toml").read_text(), re.MULTILINE)
    assert found is not None
    version = found.group(1)
    proc = cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.decode().strip() == version
    assert machina_dispatch.__version__ == version
    assert machina_dispatch._core.__version__ == version


def test_help_names_every_mode_and_option() -> None:
    proc = cli("--help")
    assert proc.returncode == 0
    text = proc.stdout.decode()
    for flag in ("--list", "--run", "--serve", "--workers", "--spin-us", "--plugin", "--max-request-bytes",
                 "--max-output-bytes", "--idempotency-ttl-ms", "--idempotency-max-entries",
                 "--breaker-threshold", "lease", "MACHINA_LEASE_ENFORCE"):
        assert flag in text, flag


def test_no_mode_is_a_usage_error() -> None:
    proc = cli()
    assert proc.returncode == 2
    assert b"choose one of --list, --run, --serve" in proc.stderr
    assert proc.stdout == b""


def test_modes_exclude_each_other() -> None:
    proc = cli("--list", "--serve")
    assert proc.returncode == 2
    assert b"excludes" in proc.stderr


def test_unknown_option_is_a_usage_error() -> None:
    proc = cli("--serve", "--frobnicate")
    assert proc.returncode == 2
    assert proc.stdout == b""


def test_workers_range_is_checked() -> None:
    proc = cli("--serve", "--workers", "0")
    assert proc.returncode == 2


def test_list_describes_builtin_tools() -> None:
    proc = cli("--list")
    assert proc.returncode == 0
    listing = json.loads(proc.stdout)
    assert listing["ok"] is True
    tools = {t["aid"]: t for t in listing["tools"]}
    assert REQUIRED_TOOLS <= tools.keys()
    fields = {"aid", "name", "description", "input_schema", "deterministic", "tags", "side_effects",
              "replay_inputs", "tier", "timeout_ms", "plugin", "runner"}
    for t in tools.values():
        assert 0 <= t["tier"] <= 3
        if "pack" in t["tags"]:
            # The host's tool packs: under our aid, and under its service names (alias_of).
            assert t["runner"] == "pack" and t["plugin"] in ("pack:files", "pack:shell", "pack:code", "pack:python"), t
            assert set(t) == fields | ({"alias_of"} if not t["aid"].startswith("AID.") else set())
            continue
        assert set(t) == fields
        assert t["runner"] == "inline"
        # Linked into the static executable, else loaded from the package's plugin pack.
        assert t["plugin"] == "built-in" if STATIC_FRONT else t["plugin"].endswith("machina_builtin_tools.so")
    assert tools["readFile"]["alias_of"] == tools["tools.file.read"]["alias_of"] == "AID.FILE.READ.v1"
    assert tools["AID.ECHO.v1"]["input_schema"] is None
    assert tools["AID.TEXT.STATS.v1"]["deterministic"] is True
    assert tools["AID.TEXT.STATS.v1"]["input_schema"]["required"] == ["text"]
    assert tools["AID.FILE.WRITE.v1"]["tier"] >= 1
    assert tools["AID.FILE.WRITE.v1"]["side_effects"] == ["fs_write"]


def test_run_reads_one_request_from_stdin() -> None:
    resp = run_json("AID.ECHO.v1", {"input_json": '{"a": [1, 2]}'})
    assert resp == ok_response('{"a": [1, 2]}', ds_state={"slots": {}})


def test_run_plugin_aid_form(test_plugins: dict[str, str]) -> None:
    proc = cli("--run", test_plugins["c_tools"], "AID.C.UPPER.v1", stdin=b'{"input_json": "\\"abc\\""}')
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ok_response('"ABC"', ds_state={"slots": {}})


def test_serve_plugin_form_loads_only_that_plugin(test_plugins: dict[str, str]) -> None:
    proc = subprocess.run([TOOLHOST, "--serve", test_plugins["c_tools"]],
                          input=b'{"aid":"AID.C.UPPER.v1","input_json":"\\"x\\""}\n{"aid":"AID.ECHO.v1"}\n',
                          capture_output=True, env=base_env(), timeout=30)
    assert proc.returncode == 0, proc.stderr
    got = [json.loads(line) for line in proc.stdout.splitlines()]
    assert got[0] == ok_response('"X"')
    assert got[1]["code"] == "tool_not_found"


def test_run_with_empty_stdin_is_a_malformed_request() -> None:
    # Not a call with {}: a client that sent nothing has a bug, and the tool must not run.
    for stdin in (b"", b"  \n"):
        assert run_json("AID.ECHO.v1", stdin) == {
            "ok": False, "status": "INVALID_PICK", "code": "malformed_request",
            "error": "malformed request: no request on stdin (--run reads one JSON object)"}


def test_run_exit_code_is_zero_for_structured_errors() -> None:
    resp = run_json("AID.NOPE.v1", {})
    assert resp == {"ok": False, "status": "INVALID_PICK", "error": "tool not found: AID.NOPE.v1",
                    "code": "tool_not_found", "hint": LIST_HINT}


def test_lease_issue_prints_a_token() -> None:
    proc = subprocess.run([TOOLHOST, "lease", "issue", "--aid", "AID.FILE.WRITE.v1", "--ttl", "30"],
                          capture_output=True, env=base_env({"MACHINA_LEASE_SECRET": "s" * 32}), timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(rb"mlt1\.[0-9a-f]+\.[0-9]+\.[0-9a-f]{32}\.[0-9a-f]{64}\n", proc.stdout)


def test_lease_issue_without_secret_fails_clearly() -> None:
    proc = cli("lease", "issue", "--aid", "AID.FILE.WRITE.v1")
    assert proc.returncode == 2
    assert b"no lease secret: set MACHINA_LEASE_SECRET or MACHINA_LEASE_KEY_FILE" in proc.stderr


@pytest.mark.parametrize("args", [["AID.ECHO.v1"], ["AID.NOPE.v1"], ["./no-such-plugin.so", "AID.ECHO.v1"],
                                  ["AID.TEXT.STATS.v1"]])
@pytest.mark.parametrize("stdin", [b'{"input_json":"[1]"}', b"{bad", b'{"input_json":"{\\"text\\":\\"a b\\"}"}'])
def test_run_shortcut_matches_the_full_parser(args: list[str], stdin: bytes) -> None:
    """`--run [PLUGIN] AID` alone skips building the option parser; adding any option
    (here a no-op one) takes the full parser. Both must behave identically."""
    fast = subprocess.run([TOOLHOST, "--run", *args], input=stdin, capture_output=True, env=base_env())
    full = subprocess.run([TOOLHOST, "--workers", "1", "--run", *args], input=stdin, capture_output=True,
                          env=base_env())
    assert (fast.returncode, fast.stdout, fast.stderr) == (full.returncode, full.stdout, full.stderr)
