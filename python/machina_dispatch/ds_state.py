"""ds_state as Python objects: eight artifact slots (``DS0`` … ``DS7``) shared between a
caller and its tools, the changes a call makes (:class:`DsDelta`), and the wire forms.

A call that is given a :class:`DsState` sends it whole and, when the call succeeds,
applies the tool's changes to it in place; a call given none runs with an empty state.
This makes every transport behave the same whatever state an earlier call left in the
host process.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SLOTS", "Artifact", "DsDelta", "DsState", "slot_name"]

SLOTS: tuple[str, ...] = tuple(f"DS{i}" for i in range(8))


def slot_name(slot: int | str) -> str:
    """``3``, ``"3"`` (the dispatch contract's form) or ``"DS3"`` -> ``"DS3"``.

    Raises:
        KeyError: not a slot of DS0..DS7.
    """
    numbered = (isinstance(slot, int) and not isinstance(slot, bool)) or (isinstance(slot, str) and len(slot) == 1)
    name = f"DS{slot}" if numbered else slot
    if name not in SLOTS:
        raise KeyError(f"not a ds_state slot (DS0..DS7): {slot!r}")
    return str(name)


@dataclass(frozen=True)
class Artifact:
    """One slot's artifact. ``content_json`` is JSON text; ``size_bytes`` defaults (on the
    host) to its length."""

    type: str
    content_json: str
    provenance: str = ""
    size_bytes: int | None = None

    @classmethod
    def of(cls, type: str, content: Any, provenance: str = "") -> Artifact:
        """An artifact holding ``content`` (any JSON-encodable value)."""
        return cls(type, json.dumps(content, separators=(",", ":"), ensure_ascii=False), provenance)

    @property
    def content(self) -> Any:
        """The content, decoded."""
        return json.loads(self.content_json)

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"type": self.type, "content_json": self.content_json, "provenance": self.provenance}
        if self.size_bytes is not None:
            wire["size_bytes"] = self.size_bytes
        return wire

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> Artifact:
        return cls(str(wire["type"]), str(wire["content_json"]), str(wire.get("provenance", "")),
                   int(wire["size_bytes"]) if wire.get("size_bytes") is not None else None)


@dataclass(frozen=True)
class DsDelta:
    """What a call changed: slots set (or replaced) and slots emptied."""

    slots: Mapping[str, Artifact] = field(default_factory=dict)
    removed: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.slots) or bool(self.removed)

    @classmethod
    def from_json(cls, text: str) -> DsDelta:
        """From the ``ds_state`` of a response (``""`` means no change)."""
        if not text:
            return EMPTY_DELTA
        wire = json.loads(text)
        return cls({slot_name(name): Artifact.from_wire(a) for name, a in wire.get("slots", {}).items()},
                   tuple(slot_name(name) for name in wire.get("removed_slots", ())))


EMPTY_DELTA = DsDelta()


class DsState(MutableMapping[str, Artifact]):
    """A caller's ds_state: a mapping from slot names (``"DS0"`` … ``"DS7"``; ints 0–7 are
    accepted too) to :class:`Artifact`."""

    def __init__(self, slots: Mapping[int | str, Artifact] | None = None) -> None:
        self._slots: dict[str, Artifact] = {}
        for k, v in (slots or {}).items():
            self[k] = v

    def __getitem__(self, key: int | str) -> Artifact:
        return self._slots[slot_name(key)]

    def __setitem__(self, key: int | str, value: Artifact) -> None:
        if not isinstance(value, Artifact):
            raise TypeError(f"a ds_state slot holds an Artifact, not {type(value).__name__}")
        self._slots[slot_name(key)] = value

    def __delitem__(self, key: int | str) -> None:
        del self._slots[slot_name(key)]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._slots))

    def __len__(self) -> int:
        return len(self._slots)

    def __repr__(self) -> str:
        return f"DsState({dict(sorted(self._slots.items()))!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DsState):
            return self._slots == other._slots
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def apply(self, delta: DsDelta) -> None:
        """Applies a call's changes."""
        for name in delta.removed:
            self._slots.pop(name, None)
        for name, artifact in delta.slots.items():
            self._slots[name] = artifact

    def to_json(self) -> str:
        """The full state as the wire's ``ds_state`` object."""
        return json.dumps({"slots": {name: a.to_wire() for name, a in sorted(self._slots.items())}},
                          separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> DsState:
        """From a full-state wire object (``{"slots": {...}}``; slots named ``"DS0"`` or ``"0"``)."""
        return cls({name: Artifact.from_wire(a) for name, a in wire.get("slots", {}).items()})
