"""One API, really: what a new user meets first behaves the same on every transport —
context managers (sync and async), set-up errors, the `check` default, exception kinds,
and bad keywords. (Call results are compared in test_dispatch_parity.py.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import machina_dispatch as md
import pytest
from conftest import TOOLHOST, base_env
from dispatch_support import TRANSPORTS, make_transport


def make(name: str, **kw: object) -> md.Transport:
    plugins = kw.pop("plugins", None)
    args = kw.pop("args", None)
    if name == "inprocess":
        assert not args
        return md.InProcess(plugins, **kw)  # type: ignore[arg-type]
    if name == "pool":
        return md.Pool(1, executable=TOOLHOST, plugins=plugins, args=args, env=base_env({}), **kw)  # type: ignore[arg-type]
    return md.Spawn(TOOLHOST, plugins=plugins, args=args, env=base_env({}), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", TRANSPORTS)
def test_async_with_on_every_transport(name: str) -> None:
    async def main() -> tuple[str, list[md.ToolResult]]:
        async with make(name) as t:
            one = await t.acall("AID.ECHO.v1", {"a": 1})
            many = await t.acall_many([("AID.ECHO.v1", i) for i in range(3)])
        return one.output_json, many

    one, many = asyncio.run(main())
    assert one == '{"a":1}' and [r.output for r in many] == [0, 1, 2]


@pytest.mark.parametrize("name", TRANSPORTS)
def test_a_missing_plugin_is_a_host_error_where_the_transport_is_made(name: str, tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.so")
    with pytest.raises(md.HostError, match="nope.so") as raised:
        make(name, plugins=[missing])
    # One hierarchy: a HostError is a ToolhostError (and still a RuntimeError).
    assert isinstance(raised.value, md.ToolhostError) and isinstance(raised.value, RuntimeError)
    assert raised.value.kind == "host_error" and raised.value.result.ok is False


@pytest.mark.parametrize("name", ["pool", "spawn"])
def test_a_bad_flag_is_a_host_error_where_the_transport_is_made(name: str) -> None:
    with pytest.raises(md.HostError, match="--no-such-flag"):
        make(name, args=["--no-such-flag"])


def test_a_bad_host_option_in_process_is_a_host_error() -> None:
    with pytest.raises(md.HostError, match="isolation"):
        md.InProcess(isolation="sideways")


@pytest.mark.parametrize("name", TRANSPORTS)
def test_check_defaults_to_raising_for_every_method(name: str) -> None:
    with make_transport(name, [str(md.builtin_plugin_path())]) as t:
        with pytest.raises(md.ToolNotFound):
            t.call("AID.NOPE.v1")
        with pytest.raises(md.ToolNotFound):
            t.call_many([("AID.ECHO.v1", 1), "AID.NOPE.v1"])
        with pytest.raises(md.ToolNotFound):
            asyncio.run(t.acall_many([("AID.ECHO.v1", 1), "AID.NOPE.v1"]))

        async def one() -> md.ToolResult:
            return await t.acall("AID.NOPE.v1")

        with pytest.raises(md.ToolNotFound):
            asyncio.run(one())
        kept = t.call_many([("AID.ECHO.v1", 1), "AID.NOPE.v1"], check=False)
        assert kept[0].ok and kept[1].code == "tool_not_found"


@pytest.mark.parametrize("name", TRANSPORTS)
def test_an_exception_names_the_exact_kind_of_its_result(name: str) -> None:
    with make_transport(name, [str(md.builtin_plugin_path())]) as t:
        with pytest.raises(md.InvalidInput) as schema:
            t.call("AID.TEXT.STATS.v1", {"text": 5})
        with pytest.raises(md.InvalidInput) as not_json:
            t.call("AID.ECHO.v1", "{nope")
    assert schema.value.kind == schema.value.result.kind == "schema_violation"
    assert not_json.value.kind == not_json.value.result.kind == "invalid_input"
    assert md.InvalidInput.kind == "invalid_input"  # the class keeps its default


@pytest.mark.parametrize("name", TRANSPORTS)
def test_a_call_wrong_twice_is_refused_for_the_same_reason_everywhere(name: str) -> None:
    # Inputs are looked at before the timeout on every transport: unsendable inputs with a
    # bad timeout are an invalid_input result (not a ValueError), and a bad timeout alone
    # is a ValueError.
    with make_transport(name, [str(md.builtin_plugin_path())]) as t:
        r = t.call("AID.ECHO.v1", {1, 2}, timeout=-1, check=False)
        assert r.kind == "invalid_input" and r.status == "INVALID_PICK", r
        with pytest.raises(ValueError, match="timeout"):
            t.call("AID.ECHO.v1", {}, timeout=-1, check=False)


@pytest.mark.parametrize("name", TRANSPORTS)
def test_an_unknown_keyword_is_named(name: str) -> None:
    with pytest.raises(TypeError, match="'bogus'"):
        make(name, bogus=1)
    with make_transport(name, [str(md.builtin_plugin_path())]) as t:
        with pytest.raises(TypeError, match="'bogus'"):
            t.call("AID.ECHO.v1", {}, bogus=1)  # type: ignore[call-arg]


def test_the_transports_have_names_that_say_what_they_are() -> None:
    assert md.Pool.__name__ == "Pool" and not hasattr(md, "Toolhost")  # one name for it
    assert {md.Pool.__module__, md.InProcess.__module__, md.Spawn.__module__} == {
        "machina_dispatch.pool", "machina_dispatch.inprocess", "machina_dispatch.spawn"}
    for cls in (md.Pool, md.InProcess, md.Spawn):
        assert issubclass(cls, md.Transport) and cls.__doc__
