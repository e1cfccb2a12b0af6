"""The compiled binding's shape: the argument lists its fast entry points are parsed
from (text signatures and error texts made from them), the named state of an open
InProcess transport, and the one list of ToolResult fields the core fills."""

from __future__ import annotations

import inspect
from typing import Any, NamedTuple

import machina_dispatch as md
import pytest
from machina_dispatch import _core, _errors
from machina_dispatch._transport import Transport

REQUEST_LINE = ["id", "aid", "input_json", "idempotency_key", "lease_token", "timeout_ms", "ds_state_json", "user"]


def parameters(fn: Any) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_inprocess_call_takes_transport_calls_parameters() -> None:
    with md.InProcess() as t:
        assert parameters(t.call) == parameters(Transport.call.__get__(t))


def test_positional_entry_points_have_text_signatures() -> None:
    encode = inspect.signature(_core.encode_request).parameters
    assert list(encode) == REQUEST_LINE
    assert all(p.kind is inspect.Parameter.POSITIONAL_ONLY for p in encode.values())
    assert [name for name, p in encode.items() if p.default is inspect.Parameter.empty] == ["id", "aid", "input_json"]
    call = inspect.signature(_core.call).parameters
    assert list(call) == ["host", "aid", "input_json", "session", *REQUEST_LINE[3:]]
    assert [name for name, p in call.items() if p.default is not inspect.Parameter.empty] == ["user"]


@pytest.mark.parametrize(("args", "kwargs", "message"), [
    ((), {}, "call() missing 1 required positional argument: 'aid'"),
    (("AID.ECHO.v1", {}, None), {}, "call() takes from 1 to 2 positional arguments but 3 were given"),
    (("AID.ECHO.v1",), {"color": 1}, "call() got an unexpected keyword argument 'color'"),
    (("AID.ECHO.v1", {}), {"inputs": {}}, "call() got multiple values for argument 'inputs'"),
    ((7,), {}, "aid must be a str"),
])
def test_inprocess_call_refuses_arguments_as_python_does(args: tuple[Any, ...], kwargs: dict[str, Any],
                                                         message: str) -> None:
    with md.InProcess() as t, pytest.raises(TypeError) as e:
        t.call(*args, **kwargs)
    assert str(e.value) == message


@pytest.mark.parametrize(("args", "message"), [
    ((1, "A"), "encode_request() takes 3 to 8 positional arguments but 2 were given"),
    ((1, "A", "{}", None, None, None, None, None, None),
     "encode_request() takes 3 to 8 positional arguments but 9 were given"),
    ((1, "A", "{}", 5), "idempotency_key must be a str or None"),
    ((1, "A", "{}", None, None, None, b"{}"), "ds_state_json must be a str or None"),
])
def test_encode_request_refuses_arguments_by_name(args: tuple[Any, ...], message: str) -> None:
    with pytest.raises(TypeError) as e:
        _core.encode_request(*args)
    assert str(e.value) == message


def test_encode_requests_reads_items_as_encode_request_does() -> None:
    items: list[tuple[Any, ...]] = [(1, "A", "1"), (2, "B", "2", "key", "tok", 1500, '{"slots":{}}', "ann")]
    assert _core.encode_requests(list(items)) == b"".join(_core.encode_request(*i) for i in items)
    with pytest.raises(TypeError, match="^lease_token must be a str or None$"):
        _core.encode_requests([(1, "A", "1", None, 4)])
    with pytest.raises(TypeError, match="^encode_request\\(\\) takes 3 to 8 positional arguments but 2 were given$"):
        _core.encode_requests([(1, "A")])


def test_an_open_transport_names_what_its_compiled_call_needs() -> None:
    t = md.InProcess()
    state = t._fast
    assert isinstance(state, _core.InProcessState)
    assert state.host is t.host and state.default_timeout_ms == 30_000
    assert t.call("AID.ECHO.v1", {"a": 1}).output == {"a": 1}
    t.close()
    assert t._fast is None
    with pytest.raises(RuntimeError, match="^the InProcess transport is closed$"):
        t.call("AID.ECHO.v1", {})


def test_result_fields_are_one_list() -> None:
    assert _core.RESULT_FIELDS == md.ToolResult._fields
    assert f"{len(md.ToolResult._fields)} of them" in (_core._configure_results.__doc__ or "")


class Shorter(NamedTuple):
    aid: str
    ok: bool


def test_a_result_class_of_another_shape_is_refused() -> None:
    with pytest.raises(TypeError, match="fields \\('aid', 'ok'\\) differ from the ones the core fills"):
        _core._configure_results(Shorter, _errors.kind_table())
    with pytest.raises(TypeError, match="must be a tuple subclass"):
        _core._configure_results(dict, _errors.kind_table())
    # The registered class is unchanged: results are still ToolResults.
    with md.InProcess() as t:
        assert type(t.call("AID.ECHO.v1", {})) is md.ToolResult
