"""Refusals that tell the caller what to type next: the nearest aid to an unknown one, how to
get and send a lease, the real name of a misnamed field, the nearest flag to a misspelt one,
and the Python transports' slips (a string where a list belongs, an executable that is not)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import machina_dispatch as md
import pytest
from conftest import LEASE_SECRET, TOOLHOST, base_env, run_json, serve


def test_an_unknown_aid_is_answered_with_the_nearest_one_and_where_the_list_is() -> None:
    r = run_json("AID.ECH0.V1", {"input_json": "{}"})
    assert r["code"] == "tool_not_found"
    assert r["error"] == "tool not found: AID.ECH0.V1"  # the error text itself is unchanged
    assert r["hint"] == "did you mean AID.ECHO.v1? The tool list (--list) names every tool"
    far = run_json("NOTHING.LIKE.ANY.TOOL", {"input_json": "{}"})
    assert far["hint"] == "the tool list (--list) names every tool"


def test_the_hint_reaches_python_callers_in_details() -> None:
    with md.InProcess() as t:
        r = t.call("AID.TEXT.STAT.v1", {}, check=False)
        assert r.code == "tool_not_found" and r.details is not None
        assert r.details["hint"].startswith("did you mean AID.TEXT.STATS.v1?")
        with pytest.raises(md.ToolNotFound, match=r"tool not found: AID.TEXT.STAT.v1 \(did you mean AID.TEXT.STATS"):
            t.call("AID.TEXT.STAT.v1", {})
    with md.Pool() as p:  # a response line decoded by the client
        r = p.call("AID.TEXT.STAT.v1", {}, check=False)
        assert r.details is not None and r.details["hint"].startswith("did you mean AID.TEXT.STATS.v1?")


def test_lease_required_says_how_to_get_and_send_a_lease_beside_the_exact_error() -> None:
    env = {"MACHINA_LEASE_ENFORCE": "1", "MACHINA_LEASE_SECRET": LEASE_SECRET}
    [r] = serve([{"aid": "AID.FILE.WRITE.v1", "input_json": '{"path": "a.txt", "content": "x"}'}], env=env)
    assert r["error"] == "lease_required" and r["tier"] == 1 and r["aid"] == "AID.FILE.WRITE.v1"
    assert "machina-toolhost lease issue --aid AID.FILE.WRITE.v1" in r["hint"]
    assert "`_lease_token`" in r["hint"]


def test_a_lease_sent_under_the_python_keyword_name_is_told_the_fields_real_name() -> None:
    [r] = serve([{"aid": "AID.ECHO.v1", "input_json": "{}", "lease_token": "tok"}])
    assert r["code"] == "malformed_request"
    assert r["error"] == ("malformed request: field 'lease_token' is not a request field: "
                          "a lease is sent as '_lease_token'")
    [ok] = serve([{"aid": "AID.ECHO.v1", "input_json": "{}", "some_extension": 1}])
    assert ok["ok"] is True  # other unknown fields are still ignored


def test_a_misspelt_flag_is_answered_with_the_nearest_flag() -> None:
    r = subprocess.run([TOOLHOST, "--serv"], capture_output=True, text=True, env=base_env(), timeout=30)
    assert r.returncode == 2
    assert "--serv is not an option; did you mean --serve?" in r.stderr
    r = subprocess.run([TOOLHOST, "--list", "--max-timout-ms=5"], capture_output=True, text=True, env=base_env(),
                       timeout=30)
    assert r.returncode == 2 and "did you mean --max-timeout-ms?" in r.stderr
    r = subprocess.run([TOOLHOST, "--list", "--zzzzzzzz"], capture_output=True, text=True, env=base_env(), timeout=30)
    assert r.returncode == 2 and "did you mean" not in r.stderr


@pytest.mark.parametrize("make", [
    lambda: md.InProcess(tools="x.toml"),
    lambda: md.InProcess(plugins="x.so"),
    lambda: md.Pool(tools=Path("x.toml")),  # type: ignore[arg-type]  # the slip this test makes
    lambda: md.Spawn(args="--workers 2"),  # type: ignore[arg-type]  # the slip this test makes
])
def test_a_single_string_where_a_list_belongs_is_named(make: object) -> None:
    with pytest.raises(TypeError, match=r"takes a list, not a single"):
        make()  # type: ignore[operator]


def test_an_executable_that_is_not_one_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    for transport in (md.Pool, md.Spawn):
        with pytest.raises(md.ExecutableNotFound, match=rf"executable='{missing}' is not an executable file"):
            transport(executable=missing)


def load_error(tmp_path: Path, manifest: str) -> str:
    path = tmp_path / "tools.toml"
    path.write_text(manifest)
    r = subprocess.run([TOOLHOST, "--tools", str(path), "--list"], capture_output=True, text=True, env=base_env(),
                       timeout=30)
    assert r.returncode != 0
    return r.stderr.strip().removeprefix(f"machina-toolhost: {path}:")


def test_a_misspelt_manifest_field_is_named_beside_the_missing_or_unknown_one(tmp_path: Path) -> None:
    assert load_error(tmp_path, '[[tool]]\naid = "X.v1"\nrunnr = "python"\n') == (
        "3: tool 1 (X.v1): field 'runner': is required (is the unknown field 'runnr' a misspelling of it?)")
    assert load_error(tmp_path, '[[tool]]\naid = "X.v1"\nrunner = "python"\nentry = "m:f"\ntimout_ms = 5\n') == (
        "5: tool 1 (X.v1): unknown field 'timout_ms' (did you mean 'timeout_ms'?)")
    assert load_error(tmp_path, '[[tool]]\naid = "X.v1"\nrunner = "python"\nentry = "m:f"\nzzz = 5\n') == (
        "5: tool 1 (X.v1): unknown field 'zzz'")


def test_a_toml_syntax_error_says_where_in_plain_words(tmp_path: Path) -> None:
    assert load_error(tmp_path, '[[tool]\naid = "X.v1"\n') == (
        "1: not valid TOML at column 8, in table header: expected ']', saw the end of the line "
        "(the line reads: [[tool])")


def test_the_nats_front_without_a_server_says_how_to_start_one() -> None:
    from nats_support import free_port

    r = subprocess.run([TOOLHOST, "--nats", f"nats://127.0.0.1:{free_port()}"], capture_output=True, text=True,
                       env=base_env(), timeout=60)
    assert r.returncode != 0
    [line] = r.stderr.splitlines()  # one line, no traceback
    assert "No server available for connection" in line and "`nats-server -js -a 127.0.0.1` starts one" in line


def test_help_points_at_documentation_that_is_installed() -> None:
    import re

    text = subprocess.run([TOOLHOST, "--help"], capture_output=True, text=True, env=base_env(), timeout=30).stdout
    where = text.rsplit(" are in ", 1)[1].strip()
    named = set(re.findall(r"docs/([\w-]+\.md)", text))
    assert {"protocol.md", "nats.md", "tool-packs.md"} <= named
    for name in named:
        assert (Path(where) / name).is_file(), name
    assert "on this address (numeric, or localhost) and port" in text  # --http takes localhost too
