"""Checks on the arguments the transports take, so that a slip is told as such rather than
surfacing later as a puzzling error of the host."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

__all__ = ["check_list_argument", "fspaths"]


def check_list_argument(name: str, value: Any) -> None:
    """Raises ``TypeError``, naming the keyword, when ``value`` is one string or path where a
    list belongs (it would otherwise be taken letter by letter)."""
    if isinstance(value, (str, bytes, os.PathLike)):
        raise TypeError(f"{name} takes a list, not a single {type(value).__name__}: "
                        f"{name}=[{value!r}]")


def fspaths(items: Sequence[str | os.PathLike[str]] | None) -> list[str] | None:
    """The paths as strings, keeping ``None`` (the transports' "not named")."""
    return None if items is None else [os.fspath(p) for p in items]
