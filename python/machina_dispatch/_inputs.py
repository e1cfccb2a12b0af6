"""Turns what a caller passes as a tool's input into the ``input_json`` text the host
expects (Python callers pass ``inputs``, the host reads ``input_json``)."""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

__all__ = ["to_input_json"]

_ORJSON_OPTIONS = orjson.OPT_NON_STR_KEYS  # {1: x} -> {"1": x}, as json.dumps does


def to_input_json(inputs: Any) -> str:
    """``None`` -> ``"{}"``; a ``str`` is taken as JSON text as it is (the host checks it);
    ``bytes`` as UTF-8 JSON text; anything else is encoded as JSON with orjson (faster
    than :func:`json.dumps`). Besides what :func:`json.dumps`
    takes, that covers what orjson serialises natively: dataclasses, ``datetime``/``date``,
    ``UUID`` and ``Enum`` values. Integers beyond 64 bits fall back to :func:`json.dumps`.

    Raises:
        TypeError: ``inputs`` cannot be encoded as JSON (e.g. a set, NaN or an infinity,
            which JSON has no way to write).
        UnicodeDecodeError: ``bytes`` that are not UTF-8.
    """
    if inputs is None:
        return "{}"
    if type(inputs) is str:
        return inputs
    if type(inputs) is dict or type(inputs) is list:  # the usual case, straight to orjson
        return _orjson_text(inputs)
    if isinstance(inputs, str):
        return str(inputs)
    if isinstance(inputs, (bytes, bytearray, memoryview)):
        return bytes(inputs).decode("utf-8")
    return _orjson_text(inputs)


def _orjson_text(inputs: Any) -> str:
    try:
        text = orjson.dumps(inputs, option=_ORJSON_OPTIONS).decode()
    except TypeError:  # orjson.JSONEncodeError: e.g. an int beyond 64 bits; json.dumps decides
        return _json_dumps(inputs)
    # orjson writes NaN and the infinities as null, where they must be refused: only an
    # output with a null can hide one.
    if "null" in text and _has_nonfinite(inputs):
        raise TypeError("inputs are not JSON-encodable: NaN and infinities have no JSON form")
    return text


def _json_dumps(inputs: Any) -> str:
    try:
        return json.dumps(inputs, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError as e:  # NaN / Infinity
        raise TypeError(f"inputs are not JSON-encodable: {e}") from e


def _has_nonfinite(value: Any) -> bool:
    # Iterative: orjson has already refused nesting deeper than it supports.
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float):
            if not math.isfinite(v):
                return True
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return False
