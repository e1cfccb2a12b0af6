"""Turns what a caller passes as a tool's input into the ``input_json`` text the host
expects (seed §3c: Python callers pass ``inputs``, the host reads ``input_json``)."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["to_input_json"]


def to_input_json(inputs: Any) -> str:
    """``None`` -> ``"{}"``; a ``str`` is taken as JSON text as it is (the host checks it);
    ``bytes`` as UTF-8 JSON text; anything else is encoded with :func:`json.dumps`.

    Raises:
        TypeError: ``inputs`` cannot be encoded as JSON (e.g. a set, NaN).
        UnicodeDecodeError: ``bytes`` that are not UTF-8.
    """
    if inputs is None:
        return "{}"
    if type(inputs) is str:
        return inputs
    if isinstance(inputs, str):
        return str(inputs)
    if isinstance(inputs, (bytes, bytearray, memoryview)):
        return bytes(inputs).decode("utf-8")
    try:
        return json.dumps(inputs, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError as e:  # NaN / Infinity
        raise TypeError(f"inputs are not JSON-encodable: {e}") from e
