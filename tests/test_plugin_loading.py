"""Plugin ABI: version checked first, broken plugins refused whole with a message that
names the file, and the C ABI usable from plain C."""

from __future__ import annotations

import subprocess

import machina_dispatch
import pytest
from conftest import TOOLHOST, base_env, ok_response, serve

BUILTIN = str(machina_dispatch.builtin_plugin_path())

REFUSALS = {
    "wrong_abi_version": "ABI version 99 is not supported (this host speaks version 1)",
    "missing_register": "missing entry point machina_plugin_register",
    "missing_version": "missing entry point machina_plugin_abi_version",
    "duplicate_echo": f"duplicate aid AID.ECHO.v1 (already registered by {BUILTIN})",
    "bad_tier": "registration refused: tool AID.TEST.BADTIER.v1 has tier 7 (must be 0..3)",
    "bad_schema": "registration refused: tool AID.TEST.BADSCHEMA.v1: schema keyword 'pattern' at / is not supported",
}


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_cli_refuses_broken_plugin(name: str, test_plugins: dict[str, str]) -> None:
    path = test_plugins[name]
    proc = subprocess.run([TOOLHOST, "--plugin", BUILTIN, "--plugin", path, "--list"],
                          capture_output=True, env=base_env(), timeout=30)
    assert proc.returncode == 2
    assert proc.stdout == b""
    assert proc.stderr.decode() == f"machina-toolhost: plugin {path}: {REFUSALS[name]}\n"


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_core_refuses_broken_plugin_with_the_same_message(name: str, test_plugins: dict[str, str]) -> None:
    host = machina_dispatch.Host()
    path = test_plugins[name]
    with pytest.raises(machina_dispatch.HostError) as info:
        host.load_plugin(path)
    assert str(info.value) == f"plugin {path}: {REFUSALS[name]}"
    # Nothing of a refused plugin is registered (the ABI version is checked before any of
    # its tools, AID.C.UPPER.v1 among them, is taken): the host has the built-ins alone.
    aids = [t["aid"] for t in host.list_tools()]
    assert aids == [t["aid"] for t in machina_dispatch.Host().list_tools()]
    assert "AID.C.UPPER.v1" not in aids


def test_missing_file_is_named() -> None:
    proc = subprocess.run([TOOLHOST, "--plugin", "/nonexistent/p.so", "--list"], capture_output=True,
                          env=base_env(), timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.startswith(b"machina-toolhost: plugin /nonexistent/p.so: cannot load: ")


def test_plain_c_plugin_runs(test_plugins: dict[str, str]) -> None:
    responses = serve([{"aid": "AID.C.UPPER.v1", "input_json": '{"k":"abc"}'}], "--plugin", test_plugins["c_tools"])
    assert responses == [ok_response('{"K":"ABC"}')]


def test_several_plugins_together(test_plugins: dict[str, str], misbehaving: str) -> None:
    responses = serve(
        [{"aid": "AID.C.UPPER.v1", "input_json": '"a"'}, {"aid": "AID.TEST.FAIL.v1"}],
        "--plugin", test_plugins["c_tools"], "--plugin", misbehaving,
    )
    assert responses[0]["output_json"] == '"A"'
    assert responses[1]["code"] == "tool_error"


def test_same_plugin_in_two_hosts_of_one_process(misbehaving: str) -> None:
    a = machina_dispatch.Host(plugins=[misbehaving])
    b = machina_dispatch.Host(plugins=[misbehaving])
    s = machina_dispatch.Session()
    for host in (a, b):
        assert '"ok":true' in host.call_json('{"aid":"AID.TEST.COUNTER.v1"}', s)


def test_builtin_dir_override(tmp_path) -> None:  # type: ignore[no-untyped-def]
    proc = subprocess.run([TOOLHOST, "--list"], capture_output=True,
                          env=base_env({"MACHINA_TOOLHOST_PLUGIN_DIR": str(tmp_path)}), timeout=30)
    assert proc.returncode == 2
    assert f"plugin {tmp_path}/machina_builtin_tools.so: cannot load".encode() in proc.stderr


def test_each_host_finds_only_its_own_tools() -> None:
    # Each thread remembers the last tool it looked up; that must never answer for another
    # host, not even one made at the same address after the first is gone.
    from machina_dispatch import _core

    session = _core.Session()
    for _ in range(50):
        full = _core.Host()
        full.load_plugin(BUILTIN)
        assert _core.call(full, "AID.ECHO.v1", "[1]", session, None, None, None, None).ok
        del full
        empty = _core.Host()
        assert _core.call(empty, "AID.ECHO.v1", "[1]", session, None, None, None, None).code == "tool_not_found"
