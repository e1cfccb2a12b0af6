"""The one result type of every transport.

A :class:`ToolResult` is a named tuple built by the compiled module (in-process calls,
and responses read off a pipe) or by the transports for failures around the host, so
the same call gives the same tuple whichever transport ran it.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from . import _core, _errors
from .ds_state import DsDelta

__all__ = ["ToolResult"]


class ToolResult(NamedTuple):
    """One call's outcome.

    Attributes:
        aid: the tool called.
        ok: the call succeeded.
        status: ``"OK"``, ``"INVALID_PICK"``, ``"TOOL_ERROR"`` or ``"BREAKER_TRIP"``: every
            failure has one (``TOOL_ERROR`` when the host never answered), so code that reads
            only ``status`` sees every failure.
        output_json: the tool's output (JSON text); ``""`` unless ``ok``.
        error: what went wrong; ``""`` when ``ok``.
        code: the host's wire ``code``; ``None`` when ``ok`` or when the host gave no answer.
        kind: the error type (see :mod:`machina_dispatch._errors`); ``None`` when ``ok``.
        idempotent_hit: the answer was replayed from the idempotency cache.
        ds_state_json: the response's ds_state: ``None`` if it carried none, ``""`` if the call
            changed nothing, else the delta as JSON text (see :attr:`ds_delta`).
        details: extra fields: ``tier``/``aid`` for ``lease_required``, ``reason`` for
            ``lease_rejected``, ``exit_status``/``stderr`` for a crashed host, ``hint`` (what to
            do about the failure: the nearest aid to an unknown one, how to get a lease).
        trace_json: the call's trace as JSON text (Python tools and HTTP tool services: runner,
            interpreter, timings, what the tool printed, what enforced its guarantees); ``None``
            when the response had none (see :attr:`trace`).
    """

    aid: str
    ok: bool
    status: str
    output_json: str
    error: str
    code: str | None
    kind: str | None
    idempotent_hit: bool
    ds_state_json: str | None
    details: dict[str, Any] | None
    trace_json: str | None = None

    @property
    def trace(self) -> dict[str, Any] | None:
        """The call's trace, decoded (``None`` when the response had none)."""
        return None if self.trace_json is None else json.loads(self.trace_json)

    @property
    def output(self) -> Any:
        """The output, decoded from JSON.

        Raises:
            ToolhostError: the call failed (the matching subclass).
        """
        self.raise_for_error()
        return json.loads(self.output_json)

    @property
    def ds_delta(self) -> DsDelta | None:
        """What the call changed in the ds_state (``None`` when the response had no ds_state)."""
        return None if self.ds_state_json is None else DsDelta.from_json(self.ds_state_json)

    def raise_for_error(self) -> ToolResult:
        """Returns the result if it is ``ok``.

        Raises:
            ToolhostError: the subclass for :attr:`kind` (e.g. ToolTimeout, ToolNotFound).
        """
        if not self.ok:
            raise _errors.error_class(self.kind or "exception")(self)
        return self

    def to_dict(self) -> dict[str, Any]:
        """The dispatch contract's dict: the response on success; on failure
        ``{"error": True, "aid", "type", "detail"}`` plus ``code``, ``status`` and any details."""
        if self.ok:
            out: dict[str, Any] = {"ok": True, "status": self.status, "output_json": self.output_json, "error": ""}
            if self.ds_state_json is not None:
                out["ds_state"] = _delta_wire(self.ds_state_json)
            if self.idempotent_hit:
                out["idempotent_hit"] = True
            if self.trace_json is not None:
                out["trace"] = json.loads(self.trace_json)
            return out
        err: dict[str, Any] = {"error": True, "aid": self.aid, "type": self.kind, "detail": self.error}
        if self.code is not None:
            err["code"] = self.code
        err["status"] = self.status
        if self.details:
            err.update(self.details)
        if self.trace_json is not None:
            err["trace"] = json.loads(self.trace_json)
        return err

    @classmethod
    def failure(cls, aid: str, kind: str, detail: str, *, status: str = "TOOL_ERROR", **details: Any) -> ToolResult:
        """A failure found around the host (no answer from it): status ``TOOL_ERROR``, or
        ``INVALID_PICK`` for a call refused before it was sent (inputs or state that cannot
        be sent), as the host says of input it cannot read."""
        return cls(aid, False, status, "", detail, None, kind, False, None, details or None, None)


def _delta_wire(text: str) -> dict[str, Any]:
    if not text:
        return {"delta": True, "slots": {}, "removed_slots": []}
    wire: dict[str, Any] = json.loads(text)
    return wire


_core._configure_results(ToolResult, _errors.kind_table())
_core._configure_errors(_errors.HostError)
